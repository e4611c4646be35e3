--- The functions of `attn` written in C (src/binding/lua_*.c): their docs, for
-- `make doc` (LDoc) and `attn.help` alike. This file holds only comments;
-- requiring it returns an empty table.
-- @submodule attn

--- A new tensor from a number (0-dim), a nested table of numbers (its nesting gives the shape;
-- ragged tables are an error), or a copy of a tensor. `attn.tensor{{1, 2}, {3, 4}}` is [2, 2].
-- @param data a number, a nested table of numbers, or a tensor
-- @function tensor

--- A tensor of zeros: `attn.zeros(2, 3)` == `attn.zeros{2, 3}`.
-- @param ... sizes, as varargs or one table
-- @function zeros

--- A tensor of ones: `attn.ones(2, 3)` == `attn.ones{2, 3}`.
-- @param ... sizes, as varargs or one table
-- @function ones

--- A tensor of the given shape whose values are unspecified (for code that writes every
-- element).
-- @param ... sizes, as varargs or one table
-- @function empty

--- A tensor of the given shape filled with `v`: `attn.full({2, 3}, 7)`.
-- @param size a table of sizes, or one number
-- @param v the value
-- @function full

--- The identity matrix [n, m] (m defaults to n): ones on the diagonal.
-- @param n rows
-- @param[opt] m columns
-- @function eye

--- As torch.arange: the 1-D tensor start, start + step, ... below stop: `arange(5)` is 0..4,
-- `arange(1, 2, 0.25)` is 1, 1.25, 1.5, 1.75.
-- @param[opt=0] start
-- @param stop
-- @param[opt=1] step (nonzero)
-- @function arange

--- Joins a list of tensors along an existing dim: every shape must match except in `dim`.
-- @param list a table of tensors
-- @param[opt=1] dim 1-based, negative from the end
-- @function cat

--- Joins a list of same-shape tensors along a new dim `dim`: `attn.stack({a, b}, 1)` is [2,
-- ...].
-- @param list a table of tensors
-- @param[opt=1] dim 1-based, negative from the end
-- @function stack

--- Uniform [0, 1) samples from the default generator, bit for bit torch.rand's after the same
-- attn.manual_seed.
-- @param ... sizes, as varargs or one table
-- @function rand

--- Standard normal samples from the default generator, bit for bit torch.randn's after the same
-- attn.manual_seed.
-- @param ... sizes, as varargs or one table
-- @function randn

--- Seeds the default generator (PyTorch's mt19937 CPU generator): afterwards rand, randn,
-- uniform_, normal_, dropout and nn constructors draw the same numbers as PyTorch after
-- torch.manual_seed(seed).
-- @param seed an integer
-- @function manual_seed

--- The seed last given to attn.manual_seed (as torch.initial_seed).
-- @return an integer
-- @function initial_seed

--- The default generator's state as a string, for attn.set_rng_state.
-- @return a string
-- @function get_rng_state

--- Restores the default generator to a state from attn.get_rng_state.
-- @param state a string from attn.get_rng_state
-- @function set_rng_state

--- Checks a state as attn.set_rng_state does (the same errors), without changing the generator.
-- @param state a string from attn.get_rng_state
-- @return true
-- @function check_rng_state

--- n raw 32-bit draws of the default generator as a list of integers (for tests and for
-- checking ports against torch.randint streams).
-- @param n 0 <= n <= 16777216
-- @function rng_raw_u32

--- As torch.nn.functional.dropout: zeroes each element with probability p and scales the rest
-- by 1/(1-p); the mask is drawn as PyTorch's MKL builds do (the one that reproduces the
-- notebooks), or as builds without MKL do after `attn.set_dropout_stream("default")`.
-- With training = false, t itself.
-- @param t tensor
-- @param p probability in [0, 1]
-- @param[opt=true] training
-- @function dropout

--- a + b elementwise, with PyTorch broadcasting; either may be a number. Also `a + b` and
-- `t:add(b)`.
-- @param a tensor or number
-- @param b tensor or number
-- @function add

--- a - b elementwise, with PyTorch broadcasting. Also `a - b` and `t:sub(b)`.
-- @param a tensor or number
-- @param b tensor or number
-- @function sub

--- a * b elementwise (not matmul), with PyTorch broadcasting. Also `a * b` and `t:mul(b)`.
-- @param a tensor or number
-- @param b tensor or number
-- @function mul

--- a / b elementwise, with PyTorch broadcasting. Also `a / b` and `t:div(b)`.
-- @param a tensor or number
-- @param b tensor or number
-- @function div

--- a ^ b elementwise, with PyTorch broadcasting. Also `a ^ b` and `t:pow(b)`.
-- @param a tensor or number
-- @param b tensor or number
-- @function pow

--- a % b elementwise, Python's modulo as torch.remainder: the result takes the sign of b
-- (fmod, then b added where the signs differ; x % 0 is NaN), with PyTorch broadcasting. Also
-- `a % b` and `t:remainder(b)`, in place `t:remainder_(b)`. Block-mask functions use it for
-- strided patterns: `((q - k) % 4):eq(0)`.
-- @param a tensor or number
-- @param b tensor or number
-- @usage attn.remainder(attn.tensor{5.5, -5.5}, 2) --> tensor([1.5000, 0.5000])
-- @function remainder

--- a // b elementwise, Python's floor division as torch.floor_divide (rounding toward -inf,
-- computed from the exact fmod as PyTorch does; x // 0 is x / 0), with PyTorch broadcasting.
-- Also `a // b` and `t:floor_divide(b)`. Not differentiable (its result never requires grad).
-- @param a tensor or number
-- @param b tensor or number
-- @usage attn.tensor{5.5, -5.5} // 2 --> tensor([ 2., -3.])
-- @function floor_divide

--- floor(t) elementwise: the largest integer <= t, as a float (NaN and infinities kept);
-- its gradient is zero, as torch.floor's.
-- @param t tensor
-- @function floor

--- The elementwise maximum of a and b (broadcasting); NaN wins, as in torch.maximum.
-- @param a tensor or number
-- @param b tensor or number
-- @function maximum

--- The elementwise minimum of a and b (broadcasting); NaN wins, as in torch.minimum.
-- @param a tensor or number
-- @param b tensor or number
-- @function minimum

--- 1 where a == b, else 0 (a bool tensor, as PyTorch's; broadcasting).
-- @param a tensor
-- @param b tensor or number
-- @function eq

--- 1 where a ~= b, else 0 (a bool tensor, as PyTorch's; broadcasting).
-- @param a tensor
-- @param b tensor or number
-- @function ne

--- 1 where a > b, else 0 (a bool tensor, as PyTorch's; broadcasting).
-- @param a tensor
-- @param b tensor or number
-- @function gt

--- 1 where a < b, else 0 (a bool tensor, as PyTorch's; broadcasting).
-- @param a tensor
-- @param b tensor or number
-- @function lt

--- 1 where a >= b, else 0 (a bool tensor, as PyTorch's; broadcasting).
-- @param a tensor
-- @param b tensor or number
-- @function ge

--- 1 where a <= b, else 0 (a bool tensor, as PyTorch's; broadcasting).
-- @param a tensor
-- @param b tensor or number
-- @function le

--- -t elementwise (also unary `-t`).
-- @param t tensor
-- @function neg

--- e^t elementwise.
-- @param t tensor
-- @function exp

--- The natural logarithm of t elementwise (-inf at 0, NaN below).
-- @param t tensor
-- @function log

--- The square root of t elementwise (NaN below 0).
-- @param t tensor
-- @function sqrt

--- tanh(t) elementwise.
-- @param t tensor
-- @function tanh

--- |t| elementwise.
-- @param t tensor
-- @function abs

--- 1 / (1 + e^-t) elementwise.
-- @param t tensor
-- @function sigmoid

--- max(t, 0) elementwise.
-- @param t tensor
-- @function relu

--- 1 / t elementwise.
-- @param t tensor
-- @function reciprocal

--- 1 where t is nonzero (NaN included), else 0: a mask as a bool tensor (`t.dtype == "bool"`).
-- @param t tensor
-- @function bool

--- A copy of t with `value` wherever mask (broadcast to t's shape) is nonzero:
-- `scores:masked_fill(mask, -math.huge)`.
-- @param t tensor
-- @param mask tensor, nonzero = fill
-- @param value a number
-- @function masked_fill

--- The upper triangle of the last two dims of t (elements with col - row >= k), zeros below:
-- `attn.triu(attn.ones(4, 4), 1)` is a causal mask.
-- @param t tensor with at least 2 dims
-- @param[opt=0] k the diagonal
-- @function triu

--- The lower triangle of the last two dims of t (elements with col - row <= k), zeros above.
-- @param t tensor with at least 2 dims
-- @param[opt=0] k the diagonal
-- @function tril

--- The sum of all elements (a 0-dim tensor), or along dim (dropped unless keepdim).
-- @param t tensor
-- @param[opt] dim
-- @param[opt=false] keepdim
-- @function sum

--- The mean of all elements (a 0-dim tensor), or along dim (dropped unless keepdim).
-- @param t tensor
-- @param[opt] dim
-- @param[opt=false] keepdim
-- @function mean

--- The largest element (a 0-dim tensor); with dim, two tensors: the values and their 1-based
-- indices along dim.
-- @param t tensor
-- @param[opt] dim
-- @param[opt=false] keepdim
-- @function max

--- The smallest element (a 0-dim tensor); with dim, two tensors: the values and their 1-based
-- indices along dim.
-- @param t tensor
-- @param[opt] dim
-- @param[opt=false] keepdim
-- @function min

--- The 1-based index of the largest element (of the flattened tensor, or along dim).
-- @param t tensor
-- @param[opt] dim
-- @param[opt=false] keepdim
-- @function argmax

--- The 1-based index of the smallest element (of the flattened tensor, or along dim).
-- @param t tensor
-- @param[opt] dim
-- @param[opt=false] keepdim
-- @function argmin

--- softmax along dim (required), computed stably; a row of -inf gives NaN, as in PyTorch.
-- @param t tensor
-- @param dim 1-based, negative from the end
-- @function softmax

--- log(softmax(t, dim)), computed stably.
-- @param t tensor
-- @param dim 1-based, negative from the end
-- @function log_softmax

--- True when a and b have the same shape and the same values (as torch.equal).
-- @param a tensor
-- @param b tensor
-- @function equal

--- The matrix product with torch.matmul's rules: 1-D x 1-D is a dot product, 2-D x 2-D a matrix
-- product (OpenBLAS sgemm), higher dims are batches whose leading dims broadcast. Mismatched
-- inner sizes are an error naming both shapes.
-- @param a tensor
-- @param b tensor
-- @function matmul

--- The dot product of two 1-D tensors of the same size (a 0-dim tensor).
-- @param a 1-D tensor
-- @param b 1-D tensor
-- @function dot

--- softmax(q k^T * scale + bias, masked) v, by a C kernel over the leading (batch, head) dims.
-- q [..., Lq, E], k [..., Lk, E], v [..., Lk, Ev]; leading dims broadcast. A query row whose
-- keys are all hidden gives zeros, never NaN. Returns out [..., Lq, Ev], then, with
-- need_weights, the weights [..., Lq, Lk], then, with return_lse, the log-sum-exp of each
-- query row [..., Lq] (natural log of its softmax denominator, before dropout; -inf for a
-- row with no visible key), as FlashAttention keeps for its backward.
-- @param q tensor
-- @param k tensor
-- @param v tensor
-- @param[opt] opts table: `attn_mask` (PyTorch's: a bool tensor is true where the query may attend, a float one is added to the scores (and to `bias`); not with `mask` or `is_causal`, as PyTorch has only this one), `mask` (0 and 1, 1 = hidden; any other value is an error: use `bias`), `bias`, `is_causal`, `scale` (finite in float32; default 1/sqrt(E)), `dropout_p`, `need_weights`, `kernel` ("auto", "math" or "flash"; "flash" cannot return the weights), `return_lse`; the variants, in both kernels: `enable_gqa` (k, v with fewer heads, dim -3, than q: query head h reads kv head floor((h-1)/g)+1, in place), `window = {left, right}` (bottom-right aligned, d = Lk - Lq: query i sees key j iff i+d-left <= j <= i+d+right; -1 = unbounded; `{w - 1, 0}` is causal sliding-window attention of width w: w keys, the query's own included, Mistral's convention and the keys of `attn.block_mask.sliding_window(w)`; FlexAttention's blog example `q_idx - kv_idx <= W` is `{W, 0}`, i.e. width W + 1), `alibi_slopes` ([H] or [B, H]: adds -slope*|i+d-j|), `softcap = c` (c > 0: s = c*tanh(s/c) on the scaled score, before bias, ALiBi and masking), `block_mask` (an attn.BlockMask from attn.block_mask, built for the call's B, H (or 1s), Lq and Lk: hides what its fn hides; both kernels and the backward skip its empty blocks); the scriptable scores: `score_mod` (from attn.score_mod: replaces each score by its expression, after softcap and before bias, ALiBi and masks; differentiated, its captured tensors get gradients) and `mask_mod` (from attn.mask_mod: hides the keys where it is false), with every other option, in both kernels
-- @function scaled_dot_product_attention

--- FlexAttention's score_mod, traced: fn(score, b, h, q, k) is called once with traced values
-- (the scaled score and the 1-based integer positions batch, head, query, key; b is the index
-- over q's dims before -3, h along dim -3) and the expression it returns is compiled into a
-- program that both attention kernels evaluate in C over their score tiles, forward and
-- backward (no Lua per block or element). Traced values take `+ - * /`, unary `-`, `^` with a
-- number exponent, Lua numbers as constants, the methods `abs exp log sqrt tanh sigmoid sin cos
-- floor ceil sign clamp(lo, hi) minimum(x) maximum(x)`, the comparisons `lt le gt ge eq ne`
-- (booleans), `logical_and logical_or logical_not`, `attn.where(c, x, y)`, and index a captured
-- tensor: `t[e]`, `t[{e1, e2, ...}]` (every dim, 1-based, integer-valued: positions, integer
-- constants and + - * abs sign floor ceil clamp minimum maximum where of them). An index that
-- may leave the tensor over the call's positions is an error at call time (checked by interval
-- arithmetic over b, h, q, k: clamp it). `if`, `and`, `or` on a traced value cannot be traced
-- (use attn.where and :eq); `<`, `<=`, `..`, `#`, `//`, `%`, a string or table operand and
-- unknown methods are errors naming attn.score_mod. Numbers as PyTorch computes the same
-- elementwise expression in float32 (tanh is the softcap's, within 4.1e-7). With
-- `scaled_dot_product_attention`'s `score_mod`, gradients flow to q, k, v through the
-- expression and into every captured tensor that requires grad (summed over all positions, the
-- same bits for any thread count). `tostring(sm)` prints the expression.
-- @param fn a Lua function fn(score, b, h, q, k)
-- @return an attn.ScoreMod
-- @usage local rel = attn.zeros(H, 2 * L - 1, {requires_grad = true})
-- local sm = attn.score_mod(function(s, b, h, q, k) return s + rel[{h, q - k + L}] end)
-- attn.scaled_dot_product_attention(q, k, v, {score_mod = sm, is_causal = true})
-- @function score_mod

--- FlexAttention's mask_mod, traced: fn(b, h, q, k) is called once with traced 1-based
-- positions and must return a traced boolean, true where the query may attend the key (a
-- comparison such as `q:ge(k)`, combined with `logical_and` / `logical_or` / `logical_not`;
-- captured tensors are indexed as in attn.score_mod). For `scaled_dot_product_attention`'s
-- `mask_mod` (evaluated in C over the score tiles, with every other option) and for
-- `attn.block_mask(mm, B, H, Lq, Lk)`, which classifies the blocks with it in C (one pattern
-- per (b, h) only when the expression reads b or h). A row it hides entirely gives zeros.
-- @param fn a Lua function fn(b, h, q, k)
-- @return an attn.ScoreMod (a mask)
-- @usage local mm = attn.mask_mod(function(b, h, q, k) return doc[{b, q}]:eq(doc[{b, k}]):logical_and(q:ge(k)) end)
-- local bm = attn.block_mask(mm, B, 1, L, L)
-- @function mask_mod

--- softmax(x x^T) x without weights or scaling (the notebooks' simplified self-attention); x is
-- [n, d] or [..., n, d].
-- @param x tensor
-- @function simple_attention

--- Writes t to a NumPy .npy file (C order): '<f4', or '|b1' for a bool tensor.
-- @param t tensor
-- @param path a string
-- @function save

--- Reads a NumPy .npy file as a tensor: '<f4' as is; '<f8', '<f2', '<i8', '<i4', '<i2', '|i1',
-- '|u1' converted to float32, integers exactly while |x| <= 2^24 (a larger one is an error
-- naming the file, the element and the value); '|b1' gives a bool tensor (0 and 1).
-- @param path a string
-- @function load

--- Writes tensors to a safetensors file (8-byte header length, JSON header, raw little-endian
-- F32 data, BOOL for a bool tensor), names in byte order, as the Python library does; module
-- weights use `m:save(path)`.
-- @param path a string
-- @param tensors a table name -> tensor
-- @param[opt] metadata a table of string -> string, stored as `__metadata__`
-- @function save_safetensors

--- Reads a safetensors file: a table name -> tensor, and the `__metadata__` table. F32 is read
-- as is; F64, F16, BF16, I64, I32, I16, I8 and U8 are converted to float32 (integers
-- exactly while |x| <= 2^24, else an error naming the tensor, the element and the value);
-- BOOL gives a bool tensor (0 and 1);
-- other dtypes, truncated or corrupt files are errors naming the file and what is wrong.
-- @param path a string
-- @return tensors, metadata
-- @function load_safetensors

--- Seconds of a monotonic clock (CLOCK_MONOTONIC), for timing.
-- @return a number
-- @function clock

--- The process's peak resident set size, in MiB.
-- @return a number
-- @function peak_rss_mb

--- True when file descriptor fd (0 stdin, 1 stdout, 2 stderr) is a terminal.
-- @param fd an integer
-- @function isatty

--- The BLAS in use: a table with `core` (OpenBLAS's CPU core name) and `threads`.
-- @return a table
-- @function blas_info

--- The elementwise and reduction ops, as declared once in src/core/op_table.h: a new list (a
-- fresh copy on each call) of tables {name, kind ("unary", "binary", "comparison" or
-- "reduction"), arity (tensor inputs), differentiable, forward (the scalar kernel as text),
-- backward (the gradient formula in PyTorch's derivatives.yaml style, when differentiable),
-- operator (the metamethod, as "__add"), inplace (the in-place method's name, as "add_"),
-- index_name (max: "argmax"), indices_of (argmax: "max")}. Each op is `attn.name` and `t:name`.
-- @return a list of tables
-- @usage attn.ops_table()[1].backward --> "self: grad; other: grad"
-- @function ops_table

--- The flash kernel's instruction set, chosen once at load: a table with
-- `kernel` (`"scalar"`, `"avx2"` or `"avx512"`), `available` (the sets this
-- CPU and build can run, best last), `forced` (the `ATTN_CPU` value that chose
-- it, or false when chosen automatically: the best available), `openblas_core`
-- (as `blas_info().core`), `threads` (OpenMP's maximum), `arch` (what the
-- build was compiled for: `"x86_64"`, `"aarch64"`, ...) and `avx512_full_width` (whether
-- the CPU runs 512-bit FMAs at full width, two 512-bit ports as on Intel server cores and
-- AMD Zen 5, rather than as two 256-bit halves as on Zen 4; false without AVX-512F;
-- inferred from cpuid's vendor and family, not measured). `ATTN_CPU=scalar|avx2|avx512`
-- forces a set; an unknown value, or one this CPU lacks, makes `require "attn"`
-- fail with the choices. Every set gives results within 2e-6 relative of the
-- others, and the same bits for any thread count.
-- @return a table
-- @usage attn.cpu_info().kernel --> "avx2"
-- @function cpu_info

-- ---- sampling and dropout streams (src/binding/lua_sampling.c, lua_rng.c) ----

--- As torch.multinomial: `n` category indices (1-based) drawn from each row of `probs`
-- ([k] gives [n], [rows, k] gives [rows, n]) with probabilities proportional to its values,
-- the same draws as PyTorch 1.13 on CPU after the same seed. Without replacement (the default)
-- no category repeats in a row; a row then needs at least n nonzero probabilities (torch would
-- return zero-probability categories in an unspecified order). Values must be finite and
-- >= 0, with a positive sum in every row.
-- @param probs tensor [k] or [rows, k]
-- @param n number of samples (>= 1; <= k without replacement)
-- @param[opt=false] replacement
-- @return a tensor of indices (float32)
-- @usage attn.multinomial(attn.tensor{0.1, 0.2, 0.7}, 2) --> tensor([3., 2.]) (for some seed)
-- @function multinomial

--- As torch.randint(low, high, size): integers uniform in [low, high) (high excluded), the
-- same draws as PyTorch after the same seed. `attn.randint(high, size)` takes low = 0. Bounds
-- lie within +-2^24 (float32 holds every integer there).
-- @param[opt=0] low
-- @param high (> low)
-- @param size a table of sizes, as {2, 3}
-- @usage attn.randint(1, 7, {10})  -- ten dice
-- @function randint

--- As torch.randperm(n) + 1: a random permutation of 1..n, the same draws as PyTorch.
-- @param n 0 <= n <= 2^24
-- @usage x:index_select(1, attn.randperm(x:size(1)))  -- shuffle the rows
-- @function randperm

--- Chooses how dropout draws its masks, everywhere (attn.dropout, nn.Dropout, the attention
-- functions' and modules' dropout): "mkl" (the default) as PyTorch's MKL builds on Intel CPUs
-- do, one random number per call (the notebooks' stream); "default" as PyTorch builds without
-- MKL do (Debian's python3-torch, macOS arm64): two per element. Each Lua state has its own
-- setting; attn.manual_seed does not change it.
-- @param stream "mkl" or "default"
-- @function set_dropout_stream

--- The dropout stream in use: "mkl" or "default" (see attn.set_dropout_stream).
-- @return a string
-- @function get_dropout_stream
-- Attention variants ---------------------------------------------------------

--- The ALiBi paper's head slopes [H], as its reference get_slopes: for H a power of 2,
-- 2^(-8/H) to the powers 1..H; else those of the largest power of 2 below H followed by every
-- other slope of twice that power. For `scaled_dot_product_attention`'s `alibi_slopes`.
-- @param H an integer >= 1
-- @return a tensor [H]
-- @usage attn.alibi_slopes(4) --> tensor([0.2500, 0.0625, 0.0156, 0.0039])
-- @function alibi_slopes

--- A block-sparse mask (FlexAttention's BlockMask) for `scaled_dot_product_attention`'s
-- `block_mask`: the [Lq, Lk] scores of each (b, h) are cut into blocks of `block` queries by
-- `block` keys (default 128; for max(Lq, Lk) under 1024 the multiple of 16 at or above L/8),
-- and fn(b, h, q, k) is called once per block (never per element) with 1-based numbers b, h
-- and 1-based index tensors q [n, 1], k [1, m]; it returns a tensor broadcastable to [n, m],
-- nonzero = visible (FlexAttention's mask_mod convention, the opposite of `mask`). Blocks are
-- classified empty (skipped), full (no mask work) or partial (their elements kept as bytes).
-- A Lua fn is called per block and per (b, h) (B x H patterns; a B or H of 1 broadcasts); the
-- built-ins, fields of this callable table, are evaluated in C and kept once:
-- `attn.block_mask.causal` (k <= q), `.sliding_window(w)` (causal and q - k < w: w keys, the
-- query's own included; FlexAttention's `q_idx - kv_idx <= W` is `.sliding_window(W + 1)`),
-- `.document(ids)` (ids: [L] tensor, L >= max(Lq, Lk); same id), `.and_(f, g, ...)`,
-- `.or_(f, g, ...)` (a Lua fn among them is called per block). The result, an attn.BlockMask,
-- has fields B, H, Lq, Lk, block, methods `bm:sparsity()` (fraction of blocks skipped) and
-- `bm:to_dense()` ([B, H, Lq, Lk], 1 = visible), and `tostring(bm)` draws its blocks
-- (full, partial, empty; rows = query blocks). An error in fn is raised naming
-- attn.block_mask and the block, with fn's message.
-- A mask_mod (attn.mask_mod(fn)) as fn is evaluated in C by its program, never calling Lua.
-- @param fn attn.mask_mod(...), a Lua function or a built-in mask function
-- @param B batch size (>= 1)
-- @param H heads (>= 1)
-- @param Lq queries
-- @param Lk keys
-- @param[opt] opts table: `block` (an integer in [1, 4096])
-- @return an attn.BlockMask
-- @usage local bm = attn.block_mask(attn.block_mask.and_(attn.block_mask.document(ids), attn.block_mask.causal), 1, 8, n, n)
-- attn.scaled_dot_product_attention(q, k, v, {block_mask = bm})
-- @function block_mask

--- The built-in causal mask function for `attn.block_mask`: key k is visible to query q iff
-- k <= q (1-based positions). Evaluated in C, never calling Lua.
-- @usage attn.block_mask(attn.block_mask.causal, 1, 8, n, n)
-- @function block_mask.causal

--- The built-in causal sliding-window mask for `attn.block_mask`: query q sees key k iff
-- k <= q and q - k < w, the w keys that end at its own (a window of width w, the query's own
-- key included: Mistral's `sliding_window` convention). The keys are those of
-- `scaled_dot_product_attention`'s `window = {w - 1, 0}` (Lq = Lk). FlexAttention's blog
-- example `q_idx - kv_idx <= W` (with `q_idx >= kv_idx`) sees W + 1 keys: it is
-- `sliding_window(W + 1)`. Evaluated in C, never calling Lua.
-- @param w the window width, an integer >= 1
-- @return a mask function for `attn.block_mask` (and for `and_`, `or_`)
-- @usage attn.block_mask(attn.block_mask.sliding_window(256), 1, 1, n, n) -- sees what window = {255, 0} sees
-- @function block_mask.sliding_window

--- A built-in document mask function for `attn.block_mask` (packed sequences): key k is visible
-- to query q iff ids[q] == ids[k]. Not causal by itself: combine it with `causal` through `and_`.
-- Evaluated in C.
-- @param ids a tensor [L], one document id per token, L >= max(Lq, Lk)
-- @return a mask function
-- @function block_mask.document

--- The mask function visible where every one of f, g, ... is (FlexAttention's and_masks).
-- Built-ins are combined in C; a Lua function among them is called once per block.
-- @param f a mask function (built-in or Lua)
-- @param g a mask function, and more after it
-- @return a mask function
-- @function block_mask.and_

--- The mask function visible where any one of f, g, ... is (FlexAttention's or_masks).
-- Built-ins are combined in C; a Lua function among them is called once per block.
-- @param f a mask function (built-in or Lua)
-- @param g a mask function, and more after it
-- @return a mask function
-- @function block_mask.or_

--- Rotary position embedding of x [..., n, E] (E even): each pair (a, b) of row r is rotated by
-- theta = (p_r - 1) * base^(-2i/E) (i = 0 .. E/2 - 1), a' = a cos - b sin, b' = b cos + a sin.
-- `style` "half" pairs (x[i], x[i + E/2]) as Llama and GPT-NeoX (rotate_half); "interleaved" pairs
-- (x[2i-1], x[2i]) as GPT-J. Positions are 1-based (position 1 is not rotated), default 1..n;
-- any numbers (a KV cache's offsets, fractions). Angles are computed in double.
-- Differentiable (`RopeBackward0`): its backward is `attn._rope_backward(grad, opts)`, the rotation by
-- -theta in C (raw, also callable directly).
-- @param x tensor [..., n, E]
-- @param[opt] opts table: `positions` (or opts[1]: a tensor [n] or a list of n numbers), `base` (default 10000), `style` ("half", the default, or "interleaved")
-- @return a new tensor of x's shape
-- @usage attn.rope(q, {style = "half"})
-- @function rope

-- ---- clamp, var/std, where, cumsum, indexing, sorting (lua_ops.c; erf/sin/cos: op_table.h) ----

--- The error function of t elementwise: 2/sqrt(pi) times the integral of e^(-u^2) from 0 to t.
-- @param t tensor
-- @function erf

--- sin(t) elementwise (radians).
-- @param t tensor
-- @function sin

--- cos(t) elementwise (radians).
-- @param t tensor
-- @function cos

--- Logical and of a and b elementwise (nonzero, NaN included, is true): a bool tensor; broadcasting.
-- @param a tensor
-- @param b tensor or number
-- @function logical_and

--- Logical or of a and b elementwise (nonzero, NaN included, is true): a bool tensor; broadcasting.
-- @param a tensor
-- @param b tensor or number
-- @function logical_or

--- Logical exclusive or of a and b elementwise (nonzero, NaN included, is true): a bool tensor; broadcasting.
-- @param a tensor
-- @param b tensor or number
-- @function logical_xor

--- 1 where t is 0, else 0: a bool tensor (PyTorch's `~mask`).
-- @param t tensor
-- @function logical_not

--- t limited to [min, max] elementwise: min(max(t, min), max), NaN kept, as torch.clamp. Either
-- bound may be nil (not both); a bound is a number or a tensor broadcast with t (the result
-- takes the broadcast shape). When min > max every element becomes max. `t:clamp_(min, max)`
-- works in place (tensor bounds must broadcast to t's shape).
-- @param t tensor
-- @param[opt] min a number, a tensor or nil
-- @param[opt] max a number, a tensor or nil
-- @usage x:clamp(0, 1); x:clamp(nil, 6); x:clamp_(-1, 1)
-- @function clamp

--- The variance of t: of every element (a 0-dim tensor), or along dim (keepdim keeps it as size
-- 1). Unbiased (divided by n - 1) unless `{unbiased = false}` (divided by n), as torch.var;
-- NaN when n - 1 <= 0. Summed in double in two passes.
-- @param t tensor
-- @param[opt] dim a dim (1-based, negative from the end)
-- @param[opt=false] keepdim boolean
-- @param[opt] options `{unbiased = true}`
-- @usage x:var(); x:var(2, true); x:var(-1, {unbiased = false}); x:var{unbiased = false}
-- @function var

--- The standard deviation of t (the square root of `var`, with the same arguments).
-- @param t tensor
-- @param[opt] dim a dim
-- @param[opt=false] keepdim boolean
-- @param[opt] options `{unbiased = true}`
-- @function std

--- Elements of `input` where `condition` is nonzero, else of `other`, as torch.where: the three
-- broadcast together; input and other may be numbers. `t:where(condition, other)` is
-- `attn.where(condition, t, other)`.
-- @param condition tensor (nonzero = take input)
-- @param input a tensor or a number
-- @param other a tensor or a number
-- @usage attn.where(scores:gt(0), scores, 0)
-- @function where

--- The running sum of t along dim (required): element i is the sum of elements 1..i, summed in
-- double and rounded once, as PyTorch on CPU.
-- @param t tensor
-- @param dim a dim
-- @function cumsum

--- The slices of t along dim at the given 1-based indices, in their order (repeats allowed):
-- `x:index_select(1, {3, 1})` is rows 3 and 1. A bad index is an error naming its value, its
-- position and the valid range.
-- @param t tensor
-- @param dim a dim
-- @param index a 1-D tensor of integer values or a Lua list of integers (1-based)
-- @function index_select

--- Values of t picked along dim by an index of t's rank, as torch.gather (1-based):
-- `out[i][j] = t[index[i][j]][j]` for dim 1, `t[i][index[i][j]]` for dim 2. The index may be
-- smaller than t in every dim but dim; the result has its shape.
-- @param t tensor
-- @param dim a dim
-- @param index a tensor of integer values or a nested Lua table (1-based)
-- @usage probs:gather(2, labels:unsqueeze(2))
-- @function gather

--- A copy of t with src added at the positions index gives along dim, as torch.scatter_add:
-- `out[index[i][j]][j] += src[i][j]` for dim 1, repeated indices accumulating in order.
-- `t:scatter_add_(dim, index, src)` adds in place and returns t.
-- @param t tensor
-- @param dim a dim
-- @param index a tensor of integer values or a nested Lua table (1-based), of t's rank, no larger
-- than src anywhere and than t but along dim
-- @param src tensor
-- @function scatter_add

--- t cut along dim into `chunks` views of ceil(n / chunks) elements (the last smaller; fewer
-- pieces when n is small), as torch.chunk; returned as multiple values: `local q, k, v =
-- qkv:chunk(3, -1)`. Views share t's memory.
-- @param t tensor
-- @param chunks a positive integer
-- @param[opt=1] dim a dim
-- @function chunk

--- t cut along dim into views of `size` elements (the last smaller), or of the sizes of a list
-- (which must sum to the size of dim), as torch.split; returned as multiple values.
-- @param t tensor
-- @param size a non-negative integer, or a list of them
-- @param[opt=1] dim a dim
-- @usage local a, b = x:split({1, 3}, 2)
-- @function split

--- Each slice of t along dim repeated: `repeats` a count for all, or one count per slice (a
-- 1-D tensor or a list); without dim, t is flattened first, as torch.repeat_interleave.
-- @param t tensor
-- @param repeats a non-negative integer, a tensor or a list of them
-- @param[opt] dim a dim
-- @usage attn.tensor{1, 2}:repeat_interleave(2) --> {1, 1, 2, 2}
-- @function repeat_interleave

--- The k largest (or smallest) elements of t along dim and their 1-based indices, as
-- torch.topk, ties in PyTorch 1.13's order; NaN counts as the largest. 0 <= k <= the size of dim.
-- @param t tensor
-- @param k an integer
-- @param[opt=-1] dim a dim
-- @param[opt=true] largest boolean
-- @param[opt=true] sorted boolean: in order (else in PyTorch's unspecified order)
-- @return values, indices
-- @function topk

--- t sorted along dim, and the 1-based indices the values came from, as torch.sort: equal
-- values come in the order PyTorch 1.13 gives them on CPU (its sort is not stable); NaN sorts
-- as the largest value.
-- @param t tensor
-- @param[opt=-1] dim a dim
-- @param[opt=false] descending boolean
-- @return values, indices
-- @function sort

--- The indices of `sort` alone.
-- @param t tensor
-- @param[opt=-1] dim a dim
-- @param[opt=false] descending boolean
-- @function argsort

return {}
