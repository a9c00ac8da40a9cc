//! Round-trip, dot and error tests of the quant codecs.
