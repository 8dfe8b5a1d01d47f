"""Device twins of the host kernels' per-element functions (private); see :func:`device_twin`."""

from .. import bits, floats, quant, rng
from . import device_twin

__all__ = ["mix32", "uniform24", "splitmix64", "uniform_below", "to_f16_word", "to_bf16_word",
           "level_code", "natural_exponent", "f16_to_f32_word", "negative_word", "scale_is_finite"]

mix32 = device_twin(rng.mix32)
uniform24 = device_twin(rng.uniform24, mix32=mix32)
splitmix64 = device_twin(rng.splitmix64)
uniform_below = device_twin(rng.uniform_below, splitmix64=splitmix64)
to_f16_word = device_twin(floats.to_f16_word)
to_bf16_word = device_twin(floats.to_bf16_word)
level_code = device_twin(quant.level_code, uniform24=uniform24)
natural_exponent = device_twin(quant.natural_exponent, uniform24=uniform24)
f16_to_f32_word = device_twin(floats.f16_to_f32_word)
negative_word = device_twin(bits.negative_word)
scale_is_finite = device_twin(quant.scale_is_finite)
