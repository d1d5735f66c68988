CORE_SRCS += $(wildcard src/metrics/*.c)
# the OTLP protobuf code is generated before anything that includes it compiles
$(O)/obj/src/metrics/metrics.o $(O)/obj/src/metrics/otlp.o \
	$(O)/obj/tests/unit/metrics/test_otlp.o: | $(GEN)/otlp_metrics.pb-c.h
