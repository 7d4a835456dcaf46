.PHONY: demo test bench clean

# make demo PORT=8080 (0: any free port) SCENARIO=faults
PORT ?= 8000
SCENARIO ?= default

demo:            ## install, then run the gateway with simulated upstreams
	scripts/bootstrap demo
	.venv/bin/tidegate demo --port $(PORT) --scenario $(SCENARIO)

test:            ## install, lint, type-check and run the test suite
	scripts/test

bench:           ## gateway overhead benchmark (prints figures; not a test)
	scripts/bootstrap test
	.venv/bin/python -m bench.overhead

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
