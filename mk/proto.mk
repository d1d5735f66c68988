# protoc-c: proto/*.proto -> build/gen/*.pb-c.{c,h} (never committed)
PROTOS := $(wildcard proto/*.proto)
GEN_SRCS := $(patsubst proto/%.proto,$(GEN)/%.pb-c.c,$(PROTOS))
GEN_HDRS := $(GEN_SRCS:.c=.h)

$(GEN)/%.pb-c.c $(GEN)/%.pb-c.h: proto/%.proto
	@mkdir -p $(GEN)
	@echo "  PROTOC  $<"
	@protoc-c --proto_path=proto --c_out=$(GEN) $<

# generated code is compiled without our stricter warnings
$(O)/obj/$(GEN)/%.o: $(GEN)/%.c
	@mkdir -p $(@D)
	@echo "  CC      $<"
	@$(CC) $(CPPFLAGS_ALL) -std=c11 -fPIC -pthread $(OPT) -MMD -MP $(CFLAGS) -c $< -o $@
