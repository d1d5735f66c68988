# pegaflow-sim (python/pegaflow/sim): the launcher in $(O)/bin and `make demo`.
SIM_LAUNCHER := $(O)/bin/pegaflow-sim
DEMO_DIR := build/demo
# `make demo` flags: DEMO_ARGS="--nodes 4 --requests 500" adds (later flags win)
DEMO_ARGS ?=
.PHONY: demo

all: $(SIM_LAUNCHER)

$(SIM_LAUNCHER): tools/pegaflow-sim.in mk/sim.mk
	@mkdir -p $(dir $@)
	@sed -e 's|@TOP@|$(TOP)|g' -e 's|@BIN@|$(abspath $(O))|g' $< >$@.tmp
	@chmod 755 $@.tmp && mv $@.tmp $@

# `make demo`: 3 nodes, 300 multi-turn requests, node 2 killed at 40% and restarted at 70%;
# the table on the terminal, build/demo/sim.json and build/demo/sim.svg.
demo:
	@ci/install-deps.sh
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@mkdir -p $(DEMO_DIR)
	$(SIM_LAUNCHER) --nodes 3 --requests 300 --rate 10 --model llama-8b-like --ssd on \
	  --pool-size 64mb --kill-node 2@40% --restart-node 2@70% \
	  --json $(DEMO_DIR)/sim.json --plot $(DEMO_DIR)/sim.svg $(DEMO_ARGS)
