package event

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"unicode/utf8"
	"unsafe"
)

// This file escapes strings for JSON exactly as the driver's
// writeStringWithEscapes does (escapeHTML false), scanning eight or sixteen
// bytes at a time for the bytes that need a look of their own.

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
// driver's writeStringWithEscapes with escapeHTML false: a byte that is not
// part of valid UTF-8 is written as \ufffd.
func appendJSONString(dst []byte, s string) []byte {
	dst, _ = appendEscaped(dst, bytesOf(s), true)
	return dst
}

// appendValidJSONStringOf is appendValidJSONString for a string: false
// (and dst unchanged) when s is not valid UTF-8.
func appendValidJSONStringOf(dst []byte, s string) ([]byte, bool) {
	out, ok := appendEscaped(dst, bytesOf(s), false)
	if !ok {
		return dst, false
	}
	return out, true
}

// bytesOf returns the bytes of s without copying them; they are only
// read.
func bytesOf(s string) []byte {
	return unsafe.Slice(unsafe.StringData(s), len(s))
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
// UTF-8: it returns false (and dst holding a partial string) if not.
func appendValidJSONString(dst, s []byte) ([]byte, bool) {
	return appendEscaped(dst, s, false)
}

// appendEscaped is the one escaper of appendJSONString and
// appendValidJSONString: a string with nothing to escape is scanned once
// (sixteen or eight bytes at a time, then through a table) and copied in
// one append; others continue in appendJSONStringTail. The encoder's keys
// and strings take it in pieces (plainPrefix, then a word store,
// appendQuoted or appendJSONStringTail), reading the scan's words past a
// string's end up to its NUL, which is never plain.
func appendEscaped(dst, s []byte, lossy bool) ([]byte, bool) {
	i := plainPrefix(s, 0)
	if i < len(s) {
		return appendJSONStringTail(dst, s, i, lossy)
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"'), true
}

// appendJSONStringTail is appendEscaped for an s whose first i bytes are
// plain (jsonPlain) and whose byte i is not. A byte that is not part of
// valid UTF-8 is written as \ufffd when lossy (as the driver does), and
// otherwise ends the string: it returns false.
func appendJSONStringTail(dst, s []byte, i int, lossy bool) ([]byte, bool) {
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
		var esc string
		switch {
		case c == utf8.RuneError && size == 1:
			if !lossy {
				return dst, false
			}
			esc = `\ufffd`
		case c == '\u2028':
			esc = `\u2028`
		case c == '\u2029':
			esc = `\u2029`
		default:
			i += size
			continue
		}
		dst = append(append(dst, s[start:i]...), esc...)
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"'), true
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
