# ---- make demo: the engine workload drc demo runs on the loopback provider (src/tools/drc.c) ----
# drc-demo-engine links the system's libibverbs; drc demo runs it with build/loopnic first on
# LD_LIBRARY_PATH, straight and with build/libdrc_verbs.so preloaded.
$B/demo/drc-demo-engine: src/tools/demo_engine.c src/loopnic/loopnic.h tests/loopnic/rcqp.h
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) -Isrc/loopnic -Itests/loopnic -O2 -g $(WARN) -o $@ $< -libverbs -ldl
demo: $B/demo/drc-demo-engine $B/loopnic/libibverbs.so.1 $B/libdrc_verbs.so
