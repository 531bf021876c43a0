"""The tools that exercise the service from outside: the sale rehearsal (``sale``), the benchmark
(``bench``) and the payment channel simulator (``channel``). See docs/ARCHITECTURE.md."""
