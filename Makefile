# attn: a Lua-scriptable attention engine.
#   make          build build/attn/core.so and copy the Lua layer into build/
#                 (never installs anything: a missing package is an error that
#                 names `make deps`)
#   make deps     install the Debian packages (apt-get as root, or sudo)
#   make test     deps, then every busted spec (ends with "N passed, N failed")
#   make demo     deps, then the notebook demo
#   make install  PREFIX=/usr/local: standard Lua 5.4 paths (or INST_LIBDIR /
#                 INST_LUADIR for the C and Lua module roots, as luarocks passes),
#                 and the attn-lua and attn-busted launchers in $(PREFIX)/bin (INST_BINDIR)
#   make doc      LDoc HTML reference into doc/
#   make static   build-static/: OpenBLAS linked in (to carry to a machine without it)
#   make asan     the spec suite under ASan + UBSan + LSan; make fuzz-core: libFuzzer
#   make clean
# Layers: src/core/ is the C core (no Lua; built as $(BUILD)/libattn_core.a,
# which the C fuzzer links too), src/binding/ the Lua binding (core.so = the
# binding + that library), lua/attn/ the Lua layer.
# Portable: no -m flag reaches the core. On x86-64 only src/core/kernels_avx2.c,
# src/core/kernels_avx512.c and the GEMMs' kernels_gemm_avx2.c, kernels_gemm_avx512.c
# get -mavx2 -mfma / -mavx512f -mfma, and src/core/cpu.c picks
# one kernel set at load from cpuid (ATTN_CPU=scalar|avx2|avx512 forces one);
# elsewhere (arm64) the scalar kernels alone are built. OpenBLAS is found with
# pkg-config (openblas.pc), else in Debian's multiarch directories.

PREFIX  ?= /usr/local
BUILD   ?= build
CC      ?= gcc
LUA     ?= lua5.4
MULTIARCH := $(shell $(CC) -print-multiarch 2>/dev/null)
ifeq ($(MULTIARCH),)
MULTIARCH := $(shell dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null)
endif
PC_BLASDIR := $(patsubst %/,%,$(shell pkg-config --variable=libdir openblas 2>/dev/null))
PC_BLASINC := $(patsubst %/,%,$(shell pkg-config --variable=includedir openblas 2>/dev/null))
BLASDIR ?= $(if $(PC_BLASDIR),$(PC_BLASDIR),/usr/lib/$(MULTIARCH)/openblas-openmp)
BLASINC ?= $(if $(PC_BLASINC),$(PC_BLASINC),/usr/include/$(MULTIARCH)/openblas-openmp)
LUA_INCDIR ?= /usr/include/lua5.4
INST_LIBDIR ?= $(PREFIX)/lib/lua/5.4
INST_LUADIR ?= $(PREFIX)/share/lua/5.4
INST_BINDIR ?= $(PREFIX)/bin

# Per-instruction-set kernel files: built, with their flags, on x86-64 only.
TARGET_MACHINE := $(shell $(CC) -dumpmachine 2>/dev/null)
ISA_SRC := src/core/kernels_avx2.c src/core/kernels_avx512.c src/core/kernels_gemm_avx2.c src/core/kernels_gemm_avx512.c
ifeq ($(filter x86_64-%,$(TARGET_MACHINE)),)
SKIP_SRC := $(ISA_SRC)
endif
FLAGS_kernels_avx2   = -mavx2 -mfma
FLAGS_kernels_avx512 = -mavx512f -mfma
FLAGS_kernels_gemm_avx2   = -mavx2 -mfma
FLAGS_kernels_gemm_avx512 = -mavx512f -mfma
# sqrtf without errno (its value unchanged), so the optimizer loops vectorise
FLAGS_optim = -fno-math-errno

WARN    = -Wall -Wextra -Wshadow -Wmissing-prototypes -Wstrict-prototypes -Wdouble-promotion
CFLAGS  ?= -O2 -g
CORE_CFLAGS = $(CFLAGS) $(WARN) -std=gnu11 -fPIC -fopenmp -ffp-contract=off -fvisibility=hidden -I$(BLASINC)
ALL_CFLAGS = $(CORE_CFLAGS) -I$(LUA_INCDIR)
LDFLAGS ?=
# -z nodelete: lua_close() dlclose()s the module, which would unload libgomp
# while its idle worker threads still run its code (a segfault at exit).
ALL_LDFLAGS = $(LDFLAGS) -shared -fopenmp -Wl,-z,nodelete -L$(BLASDIR) -Wl,-rpath,$(BLASDIR) -lopenblas -lm

CORE_SRC := $(filter-out $(SKIP_SRC),$(wildcard src/core/*.c))
CORE_OBJ := $(CORE_SRC:src/%.c=$(BUILD)/obj/%.o)
CORE_LIB := $(BUILD)/libattn_core.a
BIND_SRC := $(wildcard src/binding/*.c)
BIND_OBJ := $(BIND_SRC:src/%.c=$(BUILD)/obj/%.o)
LUASRC := $(shell find lua -name '*.lua' 2>/dev/null)
LUAOUT := $(LUASRC:lua/%=$(BUILD)/%)
SO   := $(BUILD)/attn/core.so
# GPT-2's vocabulary (attn.tokenizer.gpt2() with no dir), beside the Lua files
DATASRC := $(wildcard data/gpt2/*)
DATAOUT := $(DATASRC:data/%=$(BUILD)/attn/data/%)

PACKAGES = lua5.4 liblua5.4-dev libopenblas-openmp-dev lua-busted lua-readline gcc make libopenmpi-dev openmpi-bin

# attn.dist (src/dist/): a module of its own, compiled with Open MPI's flags
# (mpicc's, else pkg-config's ompi), so that without Open MPI everything else
# still builds and require "attn.dist" names the packages to install.
MPI_CFLAGS ?= $(or $(shell mpicc --showme:compile 2>/dev/null),$(shell pkg-config --cflags ompi 2>/dev/null))
MPI_LIBS   ?= $(or $(shell mpicc --showme:link 2>/dev/null),$(shell pkg-config --libs ompi 2>/dev/null))
DIST_SO := $(if $(MPI_LIBS),$(BUILD)/attn/dist_core.so)

.PHONY: all test demo install clean deps doc have-deps
all: $(SO) $(DIST_SO) $(LUAOUT) $(DATAOUT)

# Install missing Debian packages: as root with apt-get, else with sudo, else say which.
# (With a second architecture added, dpkg -s of a package installed for both
# is ambiguous and fails: ask for the native one then.)
deps:
	@arch=$$(dpkg --print-architecture); missing=""; for p in $(PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || dpkg -s $$p:$$arch >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "attn: installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then (sudo apt-get update -qq || true) && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "attn: missing Debian packages:$$missing -- install them with: sudo apt-get install$$missing" >&2; exit 1; fi; \
	fi

# Plain `make` only checks: the headers it needs, else one message naming the
# packages and `make deps`.
have-deps:
	@[ -f $(LUA_INCDIR)/lua.h ] && [ -f $(BLASINC)/cblas.h ] || { \
	  echo "attn: cannot build: missing $(LUA_INCDIR)/lua.h or $(BLASINC)/cblas.h (Debian packages: $(PACKAGES));" \
	    "run 'make deps' (installs them with apt-get) or set LUA_INCDIR / BLASINC / BLASDIR" >&2; exit 1; }

# the core never sees lua.h: only the binding gets the Lua include path
$(BUILD)/obj/core/%.o: src/core/%.c $(wildcard src/core/*.h) | have-deps
	@mkdir -p $(dir $@)
	$(CC) $(CORE_CFLAGS) $(FLAGS_$*) -c $< -o $@

$(BUILD)/obj/binding/%.o: src/binding/%.c $(wildcard src/core/*.h src/binding/*.h) | have-deps
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Isrc/core -c $< -o $@

$(CORE_LIB): $(CORE_OBJ)
	@rm -f $@
	$(AR) rcs $@ $(CORE_OBJ)

# --whole-archive: cpu.c's load-time kernel choice must come along whatever the binding calls
$(SO): $(BIND_OBJ) $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(BIND_OBJ) -Wl,--whole-archive $(CORE_LIB) -Wl,--no-whole-archive -o $@ $(ALL_LDFLAGS)

$(BUILD)/attn/dist_core.so: $(wildcard src/dist/*.c) src/core/tensor.h src/binding/storage_version.h | have-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) -std=gnu11 -fPIC -fvisibility=hidden -I$(LUA_INCDIR) -Isrc/core -Isrc/binding $(MPI_CFLAGS) \
	  $(wildcard src/dist/*.c) -o $@ $(LDFLAGS) -shared $(MPI_LIBS)

$(BUILD)/%.lua: lua/%.lua
	@mkdir -p $(dir $@)
	cp $< $@

$(BUILD)/attn/data/%: data/%
	@mkdir -p $(dir $@)
	cp $< $@

# the core alone, from C (tests/core_test.c links $(CORE_LIB) as a C program would)
CORE_TEST := $(BUILD)/core_test
$(CORE_TEST): tests/core_test.c $(CORE_LIB) $(wildcard src/core/*.h)
	$(CC) $(CORE_CFLAGS) -Isrc/core tests/core_test.c -Wl,--whole-archive $(CORE_LIB) -Wl,--no-whole-archive \
	  -o $@ -fopenmp -L$(BLASDIR) -Wl,-rpath,$(BLASDIR) -lopenblas -lm
test-core: $(CORE_TEST)
	@$(CORE_TEST)
.PHONY: test-core

# every float through libm_exp_minus against expf (not part of `make test`: a minute per set)
EXPF_ALL := $(BUILD)/expf_all
$(EXPF_ALL): tests/expf_all.c $(CORE_LIB) $(wildcard src/core/*.h)
	$(CC) $(CORE_CFLAGS) -Isrc/core tests/expf_all.c -Wl,--whole-archive $(CORE_LIB) -Wl,--no-whole-archive \
	  -o $@ -fopenmp -L$(BLASDIR) -Wl,-rpath,$(BLASDIR) -lopenblas -lm
test-expf-all: $(EXPF_ALL)
	@$(EXPF_ALL)
.PHONY: test-expf-all

test: deps
	@$(MAKE) -s all
	@$(MAKE) -s test-core
	@scripts/run-specs

demo: deps
	@$(MAKE) -s all
	@scripts/attn-lua scripts/examples/demo.lua
	@echo
	@echo "Notebook ports (scripts/examples/seeds/) against the tensors the notebooks printed:"
	@scripts/attn-lua scripts/examples/check_seeds.lua

# The launchers (scripts/install/*.in) get the installed module's paths, so
# they work from any directory: $(INST_BINDIR)/attn-lua (scripts and the REPL)
# and $(INST_BINDIR)/attn-busted (busted on a user's own specs).
LAUNCHERS = attn-lua attn-busted
install: $(SO) $(DIST_SO) $(LUAOUT) $(DATAOUT)
	install -d $(DESTDIR)$(INST_LIBDIR)/attn $(DESTDIR)$(INST_LUADIR) $(DESTDIR)$(INST_BINDIR)
	install -m 755 $(SO) $(DESTDIR)$(INST_LIBDIR)/attn/core.so
	$(if $(DIST_SO),install -m 755 $(DIST_SO) $(DESTDIR)$(INST_LIBDIR)/attn/dist_core.so)
	cd lua && find attn -name '*.lua' -exec install -D -m 644 {} $(DESTDIR)$(INST_LUADIR)/{} \;
	for f in $(DATASRC); do install -D -m 644 $$f $(DESTDIR)$(INST_LUADIR)/attn/$$f || exit 1; done
	@mkdir -p $(BUILD)/bin
	for l in $(LAUNCHERS); do \
	  sed -e 's|@LUADIR@|$(INST_LUADIR)|g' -e 's|@LIBDIR@|$(INST_LIBDIR)|g' scripts/install/$$l.in > $(BUILD)/bin/$$l && \
	  install -m 755 $(BUILD)/bin/$$l $(DESTDIR)$(INST_BINDIR)/$$l || exit 1; \
	done

clean:
	rm -rf $(BUILD) build-asan build-static build-fuzz

# HTML reference docs from the LDoc comments (config.ld) into doc/. What it
# needs is installed as `make deps` installs (apt-get as root, or sudo), or
# named: Debian's lua-ldoc, lua-markdown (renders the README topic) and a
# Lua 5.1 or 5.2 for LDoc to run under (Debian's ldoc runs under lua-any,
# which wants one, and lua-ldoc does not always pull one in).
LDOC ?= ldoc
DOC_PACKAGES ?= lua-ldoc lua-markdown $(if $(shell command -v lua5.2 2>/dev/null),,lua5.1)
doc:
	@if ! command -v $(LDOC) >/dev/null || ! { command -v lua5.1 || command -v lua5.2; } >/dev/null; then \
	  $(MAKE) -s deps PACKAGES="$(DOC_PACKAGES)" || \
	  { echo "attn: 'make doc' needs LDoc (Debian packages: $(DOC_PACKAGES))" >&2; exit 1; }; fi
	$(LDOC) .

# The whole spec suite with AddressSanitizer + UndefinedBehaviorSanitizer (and
# LeakSanitizer): the module is built into build-asan/ and the sanitizer
# runtimes are preloaded into the (uninstrumented) lua5.4 interpreter. A 64 MiB
# free-quarantine (default 256) keeps the RSS-bound spec meaningful under ASan.
ASAN_BUILD = build-asan
# allocator_may_return_null: a refused huge allocation is an error attn reports
# (the fuzzer asks for such sizes), not a sanitizer abort.
ASAN_OPTS = detect_leaks=1:abort_on_error=0:exitcode=99:quarantine_size_mb=64:allocator_may_return_null=1
UBSAN_OPTS = print_stacktrace=1:halt_on_error=1
SANITIZE = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
asan: have-deps
	@$(MAKE) -s BUILD=$(ASAN_BUILD) CFLAGS="-O1 -g $(SANITIZE)" LDFLAGS="$(SANITIZE)" $(ASAN_BUILD)/attn/core.so \
	  $(if $(MPI_LIBS),$(ASAN_BUILD)/attn/dist_core.so) \
	  $(LUASRC:lua/%=$(ASAN_BUILD)/%) $(DATASRC:data/%=$(ASAN_BUILD)/attn/data/%)
	@LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	 ASAN_OPTIONS=$(ASAN_OPTS) UBSAN_OPTIONS=$(UBSAN_OPTS) ATTN_BUILD=$(CURDIR)/$(ASAN_BUILD) \
	 scripts/run-specs --lpath="$(ASAN_BUILD)/?.lua;$(ASAN_BUILD)/?/init.lua;spec/?.lua;scripts/lib/?.lua" \
	   --cpath="$(ASAN_BUILD)/?.so"
	@LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	 ASAN_OPTIONS=$(ASAN_OPTS) UBSAN_OPTIONS=$(UBSAN_OPTS) ATTN_BUILD=$(CURDIR)/$(ASAN_BUILD) \
	 scripts/attn-lua scripts/fuzz.lua --iterations 2000 --seed 7
.PHONY: asan

# The module with OpenBLAS linked in statically (Debian's DYNAMIC_ARCH build,
# so OPENBLAS_CORETYPE still picks the kernel), for timing on a machine that
# lacks the package: copy build-static/ and lua5.4 there and run
# ATTN_BUILD=build-static scripts/attn-lua scripts/bench.lua.
STATIC_BUILD = build-static
static: have-deps
	@$(MAKE) -s BUILD=$(STATIC_BUILD) \
	  ALL_LDFLAGS="$(LDFLAGS) -shared -fopenmp -Wl,-z,nodelete $(BLASDIR)/libopenblas.a -lgfortran -lm" \
	  $(STATIC_BUILD)/attn/core.so $(LUASRC:lua/%=$(STATIC_BUILD)/%) $(DATASRC:data/%=$(STATIC_BUILD)/attn/data/%)
.PHONY: static

# libFuzzer harness for the C core (fuzz/core_fuzz.c) under ASan + UBSan, run
# for FUZZ_SECONDS with the committed seeds (fuzz/seeds/) plus a working corpus
# in build-fuzz/corpus. Needs clang (Debian clang-14, libomp-dev); not part of
# `make test`. A crash leaves its input as build-fuzz/crash-*: reproduce with
# build-fuzz/core_fuzz build-fuzz/crash-...
FUZZ_BUILD   = build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_SANITIZE = -fsanitize=fuzzer,address,undefined,float-cast-overflow -fno-sanitize-recover=all
FUZZ_CFLAGS   = -O1 -g $(FUZZ_SANITIZE) -fno-omit-frame-pointer $(WARN) -std=gnu11 -fopenmp -ffp-contract=off -I$(BLASINC)
# each core file compiled apart, so the ISA files get their own -m flags
FUZZ_OBJ     := $(CORE_SRC:src/core/%.c=$(FUZZ_BUILD)/obj/%.o)
$(FUZZ_BUILD)/obj/%.o: src/core/%.c $(wildcard src/core/*.h)
	@command -v $(FUZZ_CC) >/dev/null || { echo "attn: 'make fuzz-core' needs clang: sudo apt-get install clang libomp-dev" >&2; exit 1; }
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FLAGS_$*) -c $< -o $@
$(FUZZ_BUILD)/libattn_core.a: $(FUZZ_OBJ)
	@rm -f $@
	$(AR) rcs $@ $(FUZZ_OBJ)
$(FUZZ_BUILD)/core_fuzz: fuzz/core_fuzz.c $(FUZZ_BUILD)/libattn_core.a $(wildcard src/core/*.h)
	@mkdir -p $(FUZZ_BUILD)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Isrc/core fuzz/core_fuzz.c -Wl,--whole-archive $(FUZZ_BUILD)/libattn_core.a -Wl,--no-whole-archive \
	  -o $@ -L$(BLASDIR) -Wl,-rpath,$(BLASDIR) -lopenblas -lm

fuzz-core: $(FUZZ_BUILD)/core_fuzz
	@mkdir -p $(FUZZ_BUILD)/corpus
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 OMP_NUM_THREADS=2 \
	  $(FUZZ_BUILD)/core_fuzz -max_total_time=$(FUZZ_SECONDS) -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
	  -artifact_prefix=$(FUZZ_BUILD)/ $(FUZZ_BUILD)/corpus fuzz/seeds
.PHONY: fuzz-core
