.PHONY: demo test bench clean

demo:            ## install, then run the gateway with simulated upstreams
	scripts/bootstrap
	.venv/bin/tidegate demo

test:            ## install, lint, type-check and run the test suite
	scripts/test

bench:           ## gateway overhead benchmark (prints figures; not a test)
	scripts/bootstrap test
	.venv/bin/python -m bench.overhead

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
