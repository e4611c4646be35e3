--- The methods of attn tensors written in C (`t:name(...)`, src/binding/lua_*.c):
-- their docs, for `make doc` (LDoc) and `attn.help` alike. Methods that are
-- also `attn` functions (`t:matmul(u)` is `attn.matmul(t, u)`) are documented
-- there. This file holds only comments; requiring it returns an empty table.
-- @submodule attn

--- The shape as a table ({2, 3}), or with d the size of dim d. Also `t.shape`; `#t` is the size
-- of dim 1.
-- @param[opt] d a dim, 1-based
-- @function Tensor:size

--- The strides (in elements) as a table, or with d the stride of dim d.
-- @param[opt] d a dim, 1-based
-- @function Tensor:stride

--- The number of dims (0 for a scalar tensor).
-- @function Tensor:dim

--- The number of elements.
-- @function Tensor:numel

--- True when the elements are laid out in row-major order without gaps.
-- @function Tensor:is_contiguous

--- True when some elements share memory (an expanded view, `ones(1):expand(3)`): in-place
-- writes (`copy_`, `add_`, ...) refuse such a tensor.
-- @function Tensor:has_internal_overlap

--- The value of a one-element tensor as a Lua number.
-- @function Tensor:item

--- The values as nested Lua tables (a number for a 0-dim tensor).
-- @function Tensor:totable

--- A view with dim d removed, at index i (1-based, negative from the end). `t[i]` is
-- `t:select(1, i)`; `t[{i, j}]` selects dims 1 and 2 (PyTorch's `t[i-1, j-1]`), a number when
-- every dim is indexed; both also assign (`t[{i, j}] = 5`). Other keys than integers, tables of
-- them and method names are errors.
-- @param d a dim
-- @param i an index
-- @function Tensor:select

--- A view of len elements of dim d starting at start (1-based).
-- @param d a dim
-- @param start an index
-- @param len a length
-- @function Tensor:narrow

--- A view with a new shape of the same element count (one size may be -1, inferred); t must be
-- laid out compatibly (else use reshape).
-- @param ... sizes, as varargs or one table
-- @function Tensor:view

--- t with a new shape (one size may be -1): a view when possible, else a copy.
-- @param ... sizes, as varargs or one table
-- @function Tensor:reshape

--- A view with dims d1 and d2 swapped.
-- @param d1 a dim
-- @param d2 a dim
-- @function Tensor:transpose

--- The transpose of a 2-D tensor (a view); 0-D and 1-D tensors come back as they are.
-- @function Tensor:t

--- A view with the dims reordered: `t:permute(3, 1, 2)`.
-- @param ... every dim once, as varargs or one table
-- @function Tensor:permute

--- A view with a new dim of size 1 at position d.
-- @param d a dim (up to dim() + 1)
-- @function Tensor:unsqueeze

--- A view without the dims of size 1 (or only dim d, when it has size 1).
-- @param[opt] d a dim
-- @function Tensor:squeeze

--- A view broadcasting dims of size 1 to larger sizes (no copy; -1 keeps a size).
-- @param ... sizes, as varargs or one table
-- @function Tensor:expand

--- t itself when contiguous, else a contiguous copy.
-- @function Tensor:contiguous

--- A contiguous copy with its own storage.
-- @function Tensor:clone

--- t = t + other, in place (other broadcasts to t's shape); returns t.
-- @param other tensor or number
-- @function Tensor:add_

--- t = t - other, in place; returns t.
-- @param other tensor or number
-- @function Tensor:sub_

--- t = t * other elementwise, in place; returns t.
-- @param other tensor or number
-- @function Tensor:mul_

--- t = t / other, in place; returns t.
-- @param other tensor or number
-- @function Tensor:div_

--- t = t % other (torch.remainder: the sign of other), in place; returns t.
-- @param other tensor or number
-- @function Tensor:remainder_

--- Sets every element to v; returns t.
-- @param v a number
-- @function Tensor:fill_

--- Sets every element to 0; returns t.
-- @function Tensor:zero_

--- Copies src (broadcast to t's shape) into t; returns t.
-- @param src tensor
-- @function Tensor:copy_

--- Sets the elements where mask (broadcast to t's shape) is nonzero to value; returns t.
-- @param mask tensor
-- @param value a number
-- @function Tensor:masked_fill_

--- Zeroes the elements below diagonal k of the last two dims, in place; returns t.
-- @param[opt=0] k the diagonal
-- @function Tensor:triu_

--- Zeroes the elements above diagonal k of the last two dims, in place; returns t.
-- @param[opt=0] k the diagonal
-- @function Tensor:tril_

--- Fills t with uniform samples in [a, b) from the default generator, as torch's uniform_;
-- returns t.
-- @param[opt=0] a
-- @param[opt=1] b
-- @function Tensor:uniform_

--- Fills t with normal samples (mean, std) from the default generator, as torch's normal_;
-- returns t.
-- @param[opt=0] mean
-- @param[opt=1] std
-- @function Tensor:normal_

-- ---- clamp, var/std, where, cumsum, indexing, sorting (src/binding/lua_ops.c) ----

--- t limited to [min, max] in place (see attn.clamp); returns t.
-- @param[opt] min a number, a tensor (broadcast to t's shape) or nil
-- @param[opt] max a number, a tensor or nil
-- @function Tensor:clamp_

--- Adds src into t at the positions index gives along dim, in place (see attn.scatter_add);
-- returns t.
-- @param dim a dim
-- @param index a tensor of integer values or a nested Lua table (1-based)
-- @param src tensor
-- @function Tensor:scatter_add_

--- `attn.where(condition, t, other)`: t where condition is nonzero, else other.
-- @param condition tensor
-- @param other a tensor or a number
-- @function Tensor:where

return {}
