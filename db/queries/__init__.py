"""The SQL of flashsale, one module per aggregate: every statement naming a table lives here.

Plain ``text()`` statements with named parameters, so the hot-path statements keep their exact
shape (``INSERT ... SELECT``, the conditional ``UPDATE ... WHERE stock >= :quantity``).
"""
