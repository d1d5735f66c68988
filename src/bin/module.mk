BIN_NAMES += pegaflow-server pegaflow-metaserver pegaflow-cli
$(O)/bin/pegaflow-cli: $(LIBPFCLIENT)
$(O)/bin/pegaflow-cli: LINK_EXTRA := $(LIBPFCLIENT)
