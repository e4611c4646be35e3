# attn: a Lua-scriptable attention engine.
#   make          build build/attn/core.so and copy the Lua layer into build/
#   make test     run every busted spec (ends with "N passed, N failed")
#   make demo     run the notebook demo
#   make install  PREFIX=/usr/local: standard Lua 5.4 paths (or INST_LIBDIR /
#                 INST_LUADIR for the C and Lua module roots, as luarocks passes)
#   make doc      LDoc HTML reference into doc/
#   make clean

PREFIX  ?= /usr/local
BUILD   ?= build
CC      ?= gcc
LUA     ?= lua5.4
BLASDIR ?= /usr/lib/x86_64-linux-gnu/openblas-openmp
BLASINC ?= /usr/include/x86_64-linux-gnu/openblas-openmp
LUA_INCDIR ?= /usr/include/lua5.4
INST_LIBDIR ?= $(PREFIX)/lib/lua/5.4
INST_LUADIR ?= $(PREFIX)/share/lua/5.4

# FMA and AVX2 where the building CPU has them (the RNG uses fmaf either way).
ARCH := $(shell grep -q -w avx2 /proc/cpuinfo 2>/dev/null && grep -q -w fma /proc/cpuinfo 2>/dev/null && echo -mavx2 -mfma)

WARN    = -Wall -Wextra -Wshadow -Wmissing-prototypes -Wstrict-prototypes -Wdouble-promotion
CFLAGS  ?= -O2 -g
ALL_CFLAGS = $(CFLAGS) $(ARCH) $(WARN) -std=gnu11 -fPIC -fopenmp -ffp-contract=off -fvisibility=hidden \
             -I$(LUA_INCDIR) -I$(BLASINC)
LDFLAGS ?=
# -z nodelete: lua_close() dlclose()s the module, which would unload libgomp
# while its idle worker threads still run its code (a segfault at exit).
ALL_LDFLAGS = $(LDFLAGS) -shared -fopenmp -Wl,-z,nodelete -L$(BLASDIR) -Wl,-rpath,$(BLASDIR) -lopenblas -lm

SRC  := $(wildcard src/*.c)
OBJ  := $(SRC:src/%.c=$(BUILD)/obj/%.o)
LUASRC := $(shell find lua -name '*.lua' 2>/dev/null)
LUAOUT := $(LUASRC:lua/%=$(BUILD)/%)
SO   := $(BUILD)/attn/core.so

PACKAGES = lua5.4 liblua5.4-dev libopenblas-openmp-dev lua-busted gcc make

.PHONY: all test demo install clean deps doc
all: deps $(SO) $(LUAOUT)

# Install missing Debian packages: as root with apt-get, else with sudo, else say which.
deps:
	@missing=""; for p in $(PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "attn: installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then (sudo apt-get update -qq || true) && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "attn: missing Debian packages:$$missing -- install them with: sudo apt-get install$$missing" >&2; exit 1; fi; \
	fi

$(BUILD)/obj/%.o: src/%.c $(wildcard src/*.h) | deps
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(SO): $(OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(OBJ) -o $@ $(ALL_LDFLAGS)

$(BUILD)/%.lua: lua/%.lua
	@mkdir -p $(dir $@)
	cp $< $@

test: all
	@scripts/run-specs

demo: all
	@scripts/attn-lua scripts/demo.lua
	@echo
	@echo "Notebook ports (scripts/seeds/) against the tensors the notebooks printed:"
	@scripts/attn-lua scripts/check_seeds.lua

install: all
	install -d $(DESTDIR)$(INST_LIBDIR)/attn $(DESTDIR)$(INST_LUADIR)
	install -m 755 $(SO) $(DESTDIR)$(INST_LIBDIR)/attn/core.so
	cd lua && find attn -name '*.lua' -exec install -D -m 644 {} $(DESTDIR)$(INST_LUADIR)/{} \;

clean:
	rm -rf $(BUILD)

# HTML reference docs from the LDoc comments (config.ld) into doc/ (lua-markdown
# renders the README topic; without it LDoc shows it as plain text).
doc:
	@command -v ldoc >/dev/null || { echo "attn: 'make doc' needs LDoc: sudo apt-get install lua-ldoc lua-markdown" >&2; exit 1; }
	ldoc .

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
asan: deps
	@$(MAKE) -s BUILD=$(ASAN_BUILD) CFLAGS="-O1 -g $(SANITIZE)" LDFLAGS="$(SANITIZE)" $(ASAN_BUILD)/attn/core.so \
	  $(LUASRC:lua/%=$(ASAN_BUILD)/%)
	@LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	 ASAN_OPTIONS=$(ASAN_OPTS) UBSAN_OPTIONS=$(UBSAN_OPTS) ATTN_BUILD=$(CURDIR)/$(ASAN_BUILD) \
	 scripts/run-specs --lpath="$(ASAN_BUILD)/?.lua;$(ASAN_BUILD)/?/init.lua;spec/?.lua;scripts/?.lua" \
	   --cpath="$(ASAN_BUILD)/?.so"
	@LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	 ASAN_OPTIONS=$(ASAN_OPTS) UBSAN_OPTIONS=$(UBSAN_OPTS) ATTN_BUILD=$(CURDIR)/$(ASAN_BUILD) \
	 scripts/attn-lua scripts/fuzz.lua --iterations 2000 --seed 7
.PHONY: asan
