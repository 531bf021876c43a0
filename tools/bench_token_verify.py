"""What a token new to the process costs the API, in process (docs/BENCHMARKS.md, many buyers).

Rows, each in microseconds per token (best of ``--repeats`` loops over ``--tokens`` distinct
buyers' tokens, none seen before in its loop): PyJWT's ``jwt.decode`` with the parameters the API
used to pass; :class:`service.api.token_verifier.TokenVerifier`; the API's authenticator
(``Authenticator.authenticate_token``: verifier, user and the verified-token cache's insert); and
the authenticator again on the same tokens, every one now a cache hit. Also how long minting the bench's buyers
takes (:func:`toolkit.bench.buyers.mint_tokens`).

    .venv/bin/python tools/bench_token_verify.py [--tokens 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import jwt

from service.api.auth import Authenticator
from service.api.token_verifier import TokenVerifier
from service.settings import AuthSettings
from toolkit.bench.buyers import mint_tokens

SECRET = "a-bench-secret-of-at-least-32-characters"
LEEWAY = 5.0
MAX_LENGTH = AuthSettings().max_token_bytes


def _best(run: Callable[[list[str]], None], pools: list[list[str]]) -> float:
    """Best microseconds per token of ``run`` over each pool (a fresh pool per loop)."""
    best = float("inf")
    for pool in pools:
        started = time.perf_counter()
        run(pool)
        best = min(best, (time.perf_counter() - started) / len(pool) * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    started = time.perf_counter()
    pools = [mint_tokens(SECRET, f"b{n}", args.tokens) for n in range(args.repeats)]
    minted = (time.perf_counter() - started) / (args.tokens * args.repeats) * 1e6
    print(f"minting: {minted:.1f} us per token ({args.tokens:,} in {minted * args.tokens / 1e6:.2f} s)")
    options = {"require": ["exp", "sub"], "verify_aud": False, "verify_iss": False}

    def pyjwt(pool: list[str]) -> None:
        for token in pool:
            jwt.decode(token, SECRET, algorithms=["HS256"], leeway=LEEWAY, options=options)  # type: ignore[arg-type]

    def verifier(pool: list[str]) -> None:
        check = TokenVerifier(SECRET, leeway=LEEWAY, required=["exp", "sub"], max_length=MAX_LENGTH)
        check.verify(pool[0])  # the first token of an issuer admits its header: then the fast path
        for token in pool:
            check.verify(token)

    authenticator = Authenticator(SECRET, leeway_seconds=LEEWAY, max_token_length=MAX_LENGTH)

    def authenticate(pool: list[str]) -> None:
        for token in pool:
            authenticator.authenticate_token(token)

    print(f"jwt.decode: {_best(pyjwt, pools):.1f} us per new token")
    print(f"TokenVerifier.verify: {_best(verifier, pools):.1f} us per new token")
    print(f"authenticator, new tokens: {_best(authenticate, pools):.1f} us per token")
    print(f"authenticator, cached tokens: {_best(authenticate, pools):.1f} us per token")


if __name__ == "__main__":
    main()
