CLIENT_SRCS += $(wildcard src/client/*.c)
all: $(LIBPEGAFLOW)
