package event

import (
	"math"
	"strconv"
)

// This file formats doubles as the driver's Extended JSON does.

// pow10f are the powers of ten appendShortDouble scales by.
var pow10f = [...]float64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18}

// appendDouble appends f as the driver's formatDouble does:
// strconv.FormatFloat(f, 'G', -1, 64), with ".0" added when that has
// neither an exponent nor a point.
func appendDouble(dst []byte, f float64) []byte {
	if out, ok := appendShortDouble(dst, f); ok {
		return out
	}
	switch {
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...)
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...)
	case math.IsNaN(f):
		return append(dst, "NaN"...)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'G', -1, 64)
	for _, c := range dst[start:] {
		if c == 'E' || c == '.' {
			return dst
		}
	}
	return append(dst, ".0"...)
}

// appendShortDouble is appendDouble's fast path for the doubles most
// documents hold: integers below 10^6 and decimals of few digits (prices,
// measures) between 10^-4 and 10^6, the range where 'G' writes no
// exponent. It reports false for any other f.
//
// For a non-integral f it tries k = 1, 2, ... decimal places: m =
// round(|f|·10^k) is the only k-place candidate (below 10^15 the k-place
// decimals are more than four ulps of f apart, and the product's rounding
// error is under 1/16), and m/10^k is the shortest decimal that reads
// back as f when the correctly rounded quotient float64(m)/10^k (both
// exact) equals f. The first k that reads back gives FormatFloat's
// shortest digits. TestAppendDoubleMatchesStrconv checks this against
// strconv on millions of values.
func appendShortDouble(dst []byte, f float64) ([]byte, bool) {
	a := math.Abs(f)
	if !(a < 1e6) { // also NaN
		return dst, false
	}
	k := 0 // decimal places
	m := uint64(a)
	if float64(m) != a {
		if a < 1e-4 {
			return dst, false
		}
		for k = 1; ; k++ {
			if k == len(pow10f) {
				return dst, false
			}
			p := a * pow10f[k]
			if p >= 1e15 {
				return dst, false
			}
			r := math.Round(p)
			if math.Abs(p-r) > 0.25 {
				continue
			}
			if m = uint64(r); float64(m)/pow10f[k] == a {
				break
			}
		}
	}
	// The digits of m, a point before its last k (or ".0"), right to
	// left.
	var buf [24]byte
	i := len(buf)
	if k == 0 {
		i -= 2
		buf[i], buf[i+1] = '.', '0'
	} else {
		for range k {
			i--
			buf[i] = byte('0' + m%10)
			m /= 10
		}
		i--
		buf[i] = '.'
	}
	for {
		i--
		buf[i] = byte('0' + m%10)
		if m /= 10; m == 0 {
			break
		}
	}
	if math.Signbit(f) {
		i--
		buf[i] = '-'
	}
	return append(dst, buf[i:]...), true
}
