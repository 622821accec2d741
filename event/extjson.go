package event

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// This file is a direct BSON to Extended JSON encoder for envelopes. It
// produces exactly the bytes bson.MarshalExtJSON(v, canonical, false)
// produces for the same values (the envelope tests compare the two on every
// BSON type), at a fraction of the cost: no reflection, no value-writer
// state machine, no intermediate buffers. Input it does not fully
// understand (malformed BSON) makes it fail with errSlowPath, and the
// caller falls back to the driver, so behaviour on odd input is the
// driver's.

var errSlowPath = errors.New("extjson: not handled by the fast encoder")

// ErrInvalidUTF8 is returned (wrapped) by Event.Envelope for a change with
// a string or key that is not valid UTF-8. JSON cannot carry such bytes,
// and the driver's replacement by U+FFFD would lose them, so the event is
// not encoded: sinks fail it permanently (reason "encode") and the
// dead-letter entry keeps the change's raw BSON for inspection and replay.
var ErrInvalidUTF8 = errors.New("a string or key is not valid UTF-8")

// rfc3339Milli is the driver's layout for relaxed $date values.
const rfc3339Milli = "2006-01-02T15:04:05.999Z07:00"

const hexChars = "0123456789abcdef"

// appendEscapedASCII appends the JSON escape of the ASCII byte b (a
// control character, '"' or '\\'), as the driver's writeStringWithEscapes
// writes it.
func appendEscapedASCII(dst []byte, b byte) []byte {
	switch b {
	case '\\', '"':
		return append(dst, '\\', b)
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	}
	return append(dst, '\\', 'u', '0', '0', hexChars[b>>4], hexChars[b&0xF])
}

// appendJSONString appends s as a JSON string, escaped exactly as the
// driver's writeStringWithEscapes with escapeHTML false.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	i := plainPrefixString(s, 0)
	if i == len(s) {
		dst = append(dst, s...)
		return append(dst, '"')
	}
	start := 0
	for i < len(s) {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = appendEscapedASCII(append(dst, s[start:i]...), b)
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\u202`...)
			dst = append(dst, hexChars[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendValidJSONStringOf is appendValidJSONString for a string: false
// (and dst unchanged) when s is not valid UTF-8.
func appendValidJSONStringOf(dst []byte, s string) ([]byte, bool) {
	if i := plainPrefixString(s, 0); i == len(s) {
		dst = append(dst, '"')
		dst = append(dst, s...)
		return append(dst, '"'), true
	}
	if !utf8.ValidString(s) {
		return dst, false
	}
	return appendJSONString(dst, s), true
}

// envelopeCap is the capacity an encoding of n bytes of BSON starts with.
// Small changes get half again (Extended JSON of numbers, dates and
// object ids is longer than their BSON); a large change is mostly a few
// long strings or binaries, whose JSON is about their own size, so it
// gets an eighth more: a big document's buffer is allocated (and zeroed,
// and charged to the byte budget while the envelope is cached) at about
// its final size rather than 1.5 times it. An encoding that outgrows it
// grows by append's rule, one copy.
func envelopeCap(n int) int {
	if n < 64<<10 {
		return 128 + n*3/2
	}
	return 256 + n + n/8
}

// swarOnes and swarHigh are the byte-wise constants of the eight-bytes-at-
// a-time scans (nonPlainMask, elementBounds).
const (
	swarOnes = 0x0101010101010101
	swarHigh = 0x8080808080808080
)

// nonPlainMask flags, in the high bit of each of the eight bytes of w (a
// little-endian load of a string's bytes), the bytes that need a look of
// their own: below 0x20, '"', '\\', or part of a multi-byte UTF-8
// sequence (>= 0x80, flagged by w itself). A byte below 0x20 sets its
// high bit in w - 0x20 per byte, a '"' or '\\' in (w ^ c) - 1 per byte;
// other ASCII bytes set none. A subtraction borrows into the next byte
// only from a byte that is a hit, so the flags above the lowest may be
// wrong but the lowest is exact (TestNonPlainMask).
func nonPlainMask(w uint64) uint64 {
	return (w | (w - swarOnes*0x20) | ((w ^ (swarOnes * '"')) - swarOnes) | ((w ^ (swarOnes * '\\')) - swarOnes)) & swarHigh
}

// plainPrefix returns the index of the first byte of s at or after i that
// is not jsonPlain, or len(s): eight bytes at a time while eight remain,
// then through the table.
func plainPrefix(s []byte, i int) int {
	t := s[i:]
	for len(t) >= 16 { // long strings: sixteen bytes a round
		m1 := nonPlainMask(binary.LittleEndian.Uint64(t))
		m2 := nonPlainMask(binary.LittleEndian.Uint64(t[8:]))
		if m1|m2 != 0 {
			break
		}
		t = t[16:]
	}
	for len(t) >= 8 {
		if m := nonPlainMask(binary.LittleEndian.Uint64(t)); m != 0 {
			return len(s) - len(t) + bits.TrailingZeros64(m)>>3
		}
		t = t[8:]
	}
	for len(t) > 0 && jsonPlain[t[0]] {
		t = t[1:]
	}
	return len(s) - len(t)
}

// plainPrefixString is plainPrefix for a string.
func plainPrefixString(s string, i int) int {
	for i+8 <= len(s) {
		t := s[i : i+8]
		w := uint64(t[0]) | uint64(t[1])<<8 | uint64(t[2])<<16 | uint64(t[3])<<24 |
			uint64(t[4])<<32 | uint64(t[5])<<40 | uint64(t[6])<<48 | uint64(t[7])<<56
		if m := nonPlainMask(w); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	for i < len(s) && jsonPlain[s[i]] {
		i++
	}
	return i
}

// jsonPlain[b] is true for a byte that a JSON string holds as itself, as
// the driver's writeStringWithEscapes writes strings: printable ASCII
// other than '"' and '\\'. NUL is not plain, so a scan of a BSON key for
// plain bytes stops at its terminator.
var jsonPlain = func() (t [256]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// appendValidJSONString appends s as a JSON string escaped exactly as
// appendJSONString does, and checks in the same pass that s is valid
// UTF-8: it returns false (and dst holding a partial string) if not. A
// string with nothing to escape is scanned once (sixteen or eight bytes
// at a time, then through a table) and copied in one append; others
// continue in appendJSONStringTail. The encoder's keys and strings take
// it in pieces (plainPrefix, then a word store, appendQuoted or
// appendJSONStringTail), reading the scan's words past a string's end up
// to its NUL, which is never plain.
func appendValidJSONString(dst, s []byte) ([]byte, bool) {
	i := plainPrefix(s, 0)
	if i < len(s) {
		return appendJSONStringTail(dst, s, i)
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"'), true
}

// appendJSONStringTail is appendValidJSONString for an s whose first i
// bytes are plain (jsonPlain) and whose byte i is not.
func appendJSONStringTail(dst, s []byte, i int) ([]byte, bool) {
	dst = slices.Grow(dst, len(s)+8)
	dst = append(dst, '"')
	start := 0
	for {
		if i = plainPrefix(s, i); i >= len(s) {
			break
		}
		b := s[i]
		if b < utf8.RuneSelf {
			dst = appendEscapedASCII(append(dst, s[start:i]...), b)
			i++
			start = i
			continue
		}
		// A two-byte sequence (Latin, Greek, Cyrillic, ...) is valid
		// when its lead byte is C2..DF and its second a continuation.
		if b >= 0xC2 && b <= 0xDF && i+1 < len(s) && s[i+1]&0xC0 == 0x80 {
			i += 2
			continue
		}
		c, size := utf8.DecodeRune(s[i:])
		if c == utf8.RuneError && size == 1 {
			return dst, false
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\u202`...)
			dst = append(dst, hexChars[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"'), true
}

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

// digitPairs holds the two decimal digits of 0..99, as a little-endian
// 16-bit word each (the first digit in the low byte).
var digitPairs = func() (t [100]uint16) {
	for i := range t {
		t[i] = uint16('0'+i/10) | uint16('0'+i%10)<<8
	}
	return t
}()

// maxDate is the first second of year 10000 (Unix time).
const maxDate = 253402300800

// appendDateSecs appends the UTC date and time of Unix time secs, which
// must be in [0, maxDate), as "YYYY-MM-DDTHH:MM:SS", without going
// through time.Time: the civil date of a day number by Neri and
// Schneider's algorithm ("Euclidean affine functions and their
// application to calendar algorithms", 2022), with no shift needed for
// days from 1970 on (TestDateSecsMatchesTime checks the first and last day
// of every month of years 1970 to 9999 against package time).
func appendDateSecs(dst []byte, secs int64) []byte {
	days, sod := uint32(uint64(secs)/86400), uint32(uint64(secs)%86400)
	n1 := 4*(days+719468) + 3
	c := n1 / 146097
	n2 := n1%146097 | 3
	p2 := uint64(2939745) * uint64(n2)
	ny := uint32(p2) / 2939745 / 4
	y := 100*c + uint32(p2>>32)
	n3 := 2141*ny + 197913
	m, d := n3>>16, (n3&0xFFFF)/2141+1
	if ny >= 306 {
		y++
		m -= 12
	}
	h := sod / 3600
	sod -= h * 3600
	mi := sod / 60
	sec := sod - mi*60
	n := len(dst)
	dst = append(dst, "0000-00-00T00:00:00"...)
	b := dst[n : n+19]
	pair := func(i int, v uint32) { binary.LittleEndian.PutUint16(b[i:], digitPairs[v%100]) }
	pair(0, y/100)
	pair(2, y)
	pair(5, m)
	pair(8, d)
	pair(11, h)
	pair(14, mi)
	pair(17, sec)
	return dst
}

// appendFraction appends "." and the digits decimals of frac (0 < frac <
// 10^digits), zero-padded on the left, without trailing zeros: the
// fraction of a second as AppendFormat writes it with a layout of
// ".999" or ".999999999".
func appendFraction(dst []byte, frac uint64, digits int) []byte {
	for frac%10 == 0 {
		frac /= 10
		digits--
	}
	n := len(dst)
	dst = append(dst, ".000000000"[:digits+1]...)
	for j := n + digits; frac > 0; j, frac = j-1, frac/10 {
		dst[j] = byte('0' + frac%10)
	}
	return dst
}

// appendTimeRFC3339 appends the wall time t as t.AppendFormat with
// time.RFC3339Nano does (appendRFC3339UTC's 9 digits), directly for a
// UTC time of years 1970 to 9999.
func appendTimeRFC3339(dst []byte, t time.Time) []byte {
	if t.Location() != time.UTC {
		return t.AppendFormat(dst, time.RFC3339Nano)
	}
	secs := t.Unix()
	if secs < 0 || secs >= maxDate {
		return appendRFC3339UTC(dst, t, 9)
	}
	dst = appendDateSecs(dst, secs)
	if ns := t.Nanosecond(); ns != 0 {
		dst = appendFraction(dst, uint64(ns), 9)
	}
	return append(dst, 'Z')
}

// appendOID appends the 24 hex digits of the ObjectId oid (12 bytes),
// four bytes at a time: their eight nibbles spread into the bytes of a
// word, and each turned into its digit ('0' + n, or 'a' + n - 10) at once.
func appendOID(dst []byte, oid []byte) []byte {
	_ = oid[11]
	dst = slices.Grow(dst, 24)
	n := len(dst)
	dst = dst[:n+24]
	for i := 0; i < 12; i += 4 {
		x := uint64(binary.BigEndian.Uint32(oid[i:]))
		x = (x | x<<16) & 0x0000FFFF0000FFFF
		x = (x | x<<8) & 0x00FF00FF00FF00FF
		x = (x | x<<4) & 0x0F0F0F0F0F0F0F0F
		letters := (x + 0x0606060606060606) >> 4 & 0x0101010101010101
		binary.BigEndian.PutUint64(dst[n+2*i:], x+0x3030303030303030+letters*('a'-'0'-10))
	}
	return dst
}

// appendQuoted appends buf[i:j], which needs no escaping, as a JSON
// string. A string of at most eight bytes is copied with one eight-byte
// store (when buf holds eight bytes from i) rather than a copy call: the
// bytes stored past the string's end are overwritten or left beyond
// len(dst).
func appendQuoted(dst, buf []byte, i, j int) []byte {
	if n := j - i; n <= 8 && i+8 <= len(buf) {
		dst = slices.Grow(dst, 10)
		l := len(dst)
		dst = dst[:l+10]
		dst[l] = '"'
		binary.LittleEndian.PutUint64(dst[l+1:], binary.LittleEndian.Uint64(buf[i:]))
		dst[l+1+n] = '"'
		return dst[:l+2+n]
	}
	dst = append(dst, '"')
	dst = append(dst, buf[i:j]...)
	return append(dst, '"')
}

// appendExtJSONDoc appends the Extended JSON of the BSON document doc.
func appendExtJSONDoc(dst []byte, doc []byte, canonical bool) ([]byte, error) {
	if len(doc) < 5 || int(int32(binary.LittleEndian.Uint32(doc))) != len(doc) || doc[len(doc)-1] != 0 {
		return dst, errSlowPath
	}
	rem := doc[4 : len(doc)-1] // the elements, without the terminating NUL
	dst = append(dst, '{')
	for first := true; len(rem) > 0; first = false {
		if !first {
			dst = append(dst, ',')
		}
		// The key: a plain run up to its NUL is written as is;
		// anything else goes through the escaper. A plain key of at
		// most sixteen bytes (n, its NUL next) is stored as two words.
		if len(rem) >= 10 {
			w := binary.LittleEndian.Uint64(rem[1:])
			n := bits.TrailingZeros64(nonPlainMask(w)) >> 3
			var w2 uint64
			if n == 8 && len(rem) >= 18 {
				w2 = binary.LittleEndian.Uint64(rem[9:])
				n += bits.TrailingZeros64(nonPlainMask(w2)) >> 3
			}
			if rem[1+n] == 0 {
				dst = slices.Grow(dst, 19)
				p := len(dst)
				dst = dst[:p+19]
				dst[p] = '"'
				binary.LittleEndian.PutUint64(dst[p+1:], w)
				binary.LittleEndian.PutUint64(dst[p+9:], w2)
				dst[p+1+n] = '"'
				dst[p+2+n] = ':'
				dst = dst[:p+3+n]
				var err error
				if dst, rem, err = appendExtJSONValue(dst, bson.Type(rem[0]), rem[2+n:], canonical); err != nil {
					return dst, err
				}
				continue
			}
		}
		k := plainPrefix(rem, 1)
		if k < len(rem) && rem[k] == 0 {
			dst = append(appendQuoted(dst, rem, 1, k), ':')
		} else {
			n := bytes.IndexByte(rem[k:], 0)
			if n < 0 {
				return dst, errSlowPath
			}
			k += n
			var ok bool
			if dst, ok = appendValidJSONString(dst, rem[1:k]); !ok {
				return dst, ErrInvalidUTF8
			}
			dst = append(dst, ':')
		}
		var err error
		if dst, rem, err = appendExtJSONValue(dst, bson.Type(rem[0]), rem[k+1:], canonical); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

// appendExtJSONArray appends the Extended JSON of the BSON array arr.
func appendExtJSONArray(dst []byte, arr []byte, canonical bool) ([]byte, error) {
	if len(arr) < 5 || int(int32(binary.LittleEndian.Uint32(arr))) != len(arr) || arr[len(arr)-1] != 0 {
		return dst, errSlowPath
	}
	rem := arr[4 : len(arr)-1]
	dst = append(dst, '[')
	for first := true; len(rem) > 0; first = false {
		k := 1
		for k < len(rem) && rem[k] != 0 {
			k++
		}
		if k >= len(rem) {
			return dst, errSlowPath
		}
		if !first {
			dst = append(dst, ',')
		}
		var err error
		if dst, rem, err = appendExtJSONValue(dst, bson.Type(rem[0]), rem[k+1:], canonical); err != nil {
			return dst, err
		}
	}
	return append(dst, ']'), nil
}

// readString reads a BSON string as the driver's value reader does.
func readString(src []byte) (string, []byte, bool) {
	l, rem, ok := bsoncore.ReadLength(src)
	if !ok || l <= 0 || int(l) > len(rem) || rem[l-1] != 0 {
		return "", src, false
	}
	return string(rem[:l-1]), rem[l:], true
}

// appendExtJSONValue appends the value of type t at the start of src and
// returns the rest of src.
func appendExtJSONValue(dst []byte, t bson.Type, src []byte, canonical bool) ([]byte, []byte, error) {
	switch t {
	case bson.TypeString:
		if len(src) < 4 {
			return dst, src, errSlowPath
		}
		l := int(int32(binary.LittleEndian.Uint32(src)))
		if l <= 0 || l > len(src)-4 || src[3+l] != 0 {
			return dst, src, errSlowPath
		}
		if l <= 17 && len(src) >= 20 {
			// A string of at most sixteen bytes is plain when the first
			// flagged byte of the words it starts is at its end (its
			// NUL, which is never plain, or no flag for sixteen bytes),
			// and is then stored as two words.
			w := binary.LittleEndian.Uint64(src[4:])
			n := bits.TrailingZeros64(nonPlainMask(w)) >> 3
			var w2 uint64
			if n == 8 {
				w2 = binary.LittleEndian.Uint64(src[12:])
				n += bits.TrailingZeros64(nonPlainMask(w2)) >> 3
			}
			if n == l-1 {
				dst = slices.Grow(dst, 18)
				p := len(dst)
				dst = dst[:p+18]
				dst[p] = '"'
				binary.LittleEndian.PutUint64(dst[p+1:], w)
				binary.LittleEndian.PutUint64(dst[p+9:], w2)
				dst[p+l] = '"'
				return dst[:p+l+1], src[4+l:], nil
			}
		}
		// The string's NUL is not plain: the scan stops there at the
		// latest, reading eight bytes at a time through the string.
		if k := plainPrefix(src, 4); k == 3+l {
			dst = appendQuoted(dst, src, 4, k)
		} else {
			var ok bool
			if dst, ok = appendJSONStringTail(dst, src[4:3+l], k-4); !ok {
				return dst, src, ErrInvalidUTF8
			}
		}
		return dst, src[4+l:], nil
	case bson.TypeInt32:
		if len(src) < 4 {
			return dst, src, errSlowPath
		}
		i := int64(int32(binary.LittleEndian.Uint32(src)))
		if canonical {
			dst = append(dst, `{"$numberInt":"`...)
			dst = strconv.AppendInt(dst, i, 10)
			return append(dst, `"}`...), src[4:], nil
		}
		return strconv.AppendInt(dst, i, 10), src[4:], nil
	case bson.TypeDouble:
		if len(src) < 8 {
			return dst, src, errSlowPath
		}
		f := math.Float64frombits(binary.LittleEndian.Uint64(src))
		if canonical || math.IsInf(f, 0) || math.IsNaN(f) {
			dst = append(dst, `{"$numberDouble":"`...)
			dst = appendDouble(dst, f)
			dst = append(dst, `"}`...)
		} else {
			dst = appendDouble(dst, f)
		}
		return dst, src[8:], nil
	case bson.TypeEmbeddedDocument, bson.TypeArray:
		if len(src) < 4 {
			return dst, src, errSlowPath
		}
		l := int(int32(binary.LittleEndian.Uint32(src)))
		if l < 5 || l > len(src) {
			return dst, src, errSlowPath
		}
		var err error
		if t == bson.TypeArray {
			dst, err = appendExtJSONArray(dst, src[:l], canonical)
		} else {
			dst, err = appendExtJSONDoc(dst, src[:l], canonical)
		}
		return dst, src[l:], err
	case bson.TypeObjectID:
		if len(src) < 12 {
			return dst, src, errSlowPath
		}
		dst = append(dst, `{"$oid":"`...)
		dst = appendOID(dst, src)
		return append(dst, `"}`...), src[12:], nil
	case bson.TypeBoolean:
		if len(src) < 1 {
			return dst, src, errSlowPath
		}
		switch src[0] {
		case 0:
			dst = append(dst, "false"...)
		case 1:
			dst = append(dst, "true"...)
		default:
			return dst, src, errSlowPath
		}
		return dst, src[1:], nil
	case bson.TypeDateTime:
		if len(src) < 8 {
			return dst, src, errSlowPath
		}
		// Relaxed mode writes years 1970 to 9999 as RFC 3339 (whole
		// milliseconds, UTC), others as canonical mode does.
		dt := int64(binary.LittleEndian.Uint64(src))
		if canonical || dt < 0 || dt >= maxDate*1000 {
			dst = append(dst, `{"$date":{"$numberLong":"`...)
			dst = strconv.AppendInt(dst, dt, 10)
			dst = append(dst, `"}}`...)
		} else {
			dst = append(dst, `{"$date":"`...)
			dst = appendDateSecs(dst, dt/1000)
			if ms := dt % 1000; ms != 0 {
				// ".ddd" without trailing zeros
				frac := [4]byte{'.', byte('0' + ms/100), byte('0' + ms/10%10), byte('0' + ms%10)}
				n := 4
				for frac[n-1] == '0' {
					n--
				}
				dst = append(dst, frac[:n]...)
			}
			dst = append(dst, `Z"}`...)
		}
		return dst, src[8:], nil
	case bson.TypeInt64:
		if len(src) < 8 {
			return dst, src, errSlowPath
		}
		i := int64(binary.LittleEndian.Uint64(src))
		if canonical {
			dst = append(dst, `{"$numberLong":"`...)
			dst = strconv.AppendInt(dst, i, 10)
			return append(dst, `"}`...), src[8:], nil
		}
		return strconv.AppendInt(dst, i, 10), src[8:], nil
	case bson.TypeNull:
		return append(dst, "null"...), src, nil
	case bson.TypeBinary:
		l, rem, ok := bsoncore.ReadLength(src)
		if !ok || l < 0 || len(rem) < 1 {
			return dst, src, errSlowPath
		}
		subtype := rem[0]
		rem = rem[1:]
		if subtype == 0x02 && l > 4 { // old binary: an inner length
			if l, rem, ok = bsoncore.ReadLength(rem); !ok || l < 0 {
				return dst, src, errSlowPath
			}
		}
		if int(l) > len(rem) {
			return dst, src, errSlowPath
		}
		dst = append(dst, `{"$binary":{"base64":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, rem[:l])
		dst = append(dst, `","subType":"`...)
		dst = append(dst, hexChars[subtype>>4], hexChars[subtype&0xF])
		dst = append(dst, `"}}`...)
		return dst, rem[l:], nil
	case bson.TypeUndefined:
		return append(dst, `{"$undefined":true}`...), src, nil
	case bson.TypeTimestamp:
		ts, ti, rem, ok := bsoncore.ReadTimestamp(src)
		if !ok {
			return dst, src, errSlowPath
		}
		dst = append(dst, `{"$timestamp":{"t":`...)
		dst = strconv.AppendUint(dst, uint64(ts), 10)
		dst = append(dst, `,"i":`...)
		dst = strconv.AppendUint(dst, uint64(ti), 10)
		return append(dst, `}}`...), rem, nil
	case bson.TypeRegex:
		pattern, rem, ok := bsoncore.ReadKey(src)
		if !ok {
			return dst, src, errSlowPath
		}
		options, rem, ok := bsoncore.ReadKey(rem)
		if !ok {
			return dst, src, errSlowPath
		}
		if !utf8.ValidString(pattern) || !utf8.ValidString(options) {
			return dst, src, ErrInvalidUTF8
		}
		runes := []rune(options)
		slices.Sort(runes)
		dst = append(dst, `{"$regularExpression":{"pattern":`...)
		dst = appendJSONString(dst, pattern)
		dst = append(dst, `,"options":`...)
		dst = appendJSONString(dst, string(runes))
		return append(dst, `}}`...), rem, nil
	case bson.TypeDBPointer:
		ns, rem, ok := readString(src)
		if !ok || len(rem) < 12 {
			return dst, src, errSlowPath
		}
		if !utf8.ValidString(ns) {
			return dst, src, ErrInvalidUTF8
		}
		// The driver writes the namespace unescaped; so do we.
		dst = append(dst, `{"$dbPointer":{"$ref":"`...)
		dst = append(dst, ns...)
		dst = append(dst, `","$id":{"$oid":"`...)
		dst = appendOID(dst, rem)
		return append(dst, `"}}}`...), rem[12:], nil
	case bson.TypeJavaScript:
		code, rem, ok := readString(src)
		if !ok {
			return dst, src, errSlowPath
		}
		if !utf8.ValidString(code) {
			return dst, src, ErrInvalidUTF8
		}
		dst = append(dst, `{"$code":`...)
		dst = appendJSONString(dst, code)
		return append(dst, '}'), rem, nil
	case bson.TypeSymbol:
		sym, rem, ok := readString(src)
		if !ok {
			return dst, src, errSlowPath
		}
		if !utf8.ValidString(sym) {
			return dst, src, ErrInvalidUTF8
		}
		dst = append(dst, `{"$symbol":`...)
		dst = appendJSONString(dst, sym)
		return append(dst, '}'), rem, nil
	case bson.TypeCodeWithScope:
		l, rem, ok := bsoncore.ReadLength(src)
		if !ok || l < 14 || int(l) > len(src) {
			return dst, src, errSlowPath
		}
		body := rem[:l-4]
		code, scope, ok := readString(body)
		if !ok {
			return dst, src, errSlowPath
		}
		if !utf8.ValidString(code) {
			return dst, src, ErrInvalidUTF8
		}
		dst = append(dst, `{"$code":`...)
		dst = appendJSONString(dst, code)
		dst = append(dst, `,"$scope":`...)
		dst, err := appendExtJSONDoc(dst, scope, canonical)
		if err != nil {
			return dst, src, err
		}
		return append(dst, '}'), src[l:], nil
	case bson.TypeDecimal128:
		h, l, rem, ok := bsoncore.ReadDecimal128(src)
		if !ok {
			return dst, src, errSlowPath
		}
		dst = append(dst, `{"$numberDecimal":"`...)
		dst = append(dst, bson.NewDecimal128(h, l).String()...)
		return append(dst, `"}`...), rem, nil
	case bson.TypeMinKey:
		return append(dst, `{"$minKey":1}`...), src, nil
	case bson.TypeMaxKey:
		return append(dst, `{"$maxKey":1}`...), src, nil
	}
	return dst, src, errSlowPath
}
