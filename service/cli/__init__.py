"""The ``flashsale`` console script: click commands, each a thin entry over the composition root."""
