package event

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math"
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
	start := 0
	for i := 0; i < len(s); {
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
// a-time scan of appendValidJSONString.
const (
	swarOnes = 0x0101010101010101
	swarHigh = 0x8080808080808080
)

// plainWord reports whether none of the eight bytes of w (a little-endian
// load of a string's bytes) needs a look of its own: no byte below 0x20,
// no '"', no '\\', no byte of a multi-byte UTF-8 sequence (>= 0x80). The
// tests are the classic has-less / has-zero bit tricks; they may report a
// byte that is fine (after a real hit in the same word), never miss one.
func plainWord(w uint64) bool {
	ctl := (w - swarOnes*0x20) &^ w
	q := w ^ (swarOnes * '"')
	quote := (q - swarOnes) &^ q
	bs := w ^ (swarOnes * '\\')
	back := (bs - swarOnes) &^ bs
	return (ctl|quote|back|w)&swarHigh == 0
}

// appendValidJSONString appends s as a JSON string escaped exactly as
// appendJSONString does, and checks in the same pass that s is valid
// UTF-8: it returns false (and dst holding a partial string) if not. It
// is the encoder's path for BSON strings and keys, where a document's
// bulk is: one pass, eight bytes at a time over runs that need no
// escaping, copied in one append per run into a destination grown once.
func appendValidJSONString(dst, s []byte) ([]byte, bool) {
	dst = slices.Grow(dst, len(s)+2)
	dst = append(dst, '"')
	start, i := 0, 0
	for i < len(s) {
		for i+8 <= len(s) && plainWord(binary.LittleEndian.Uint64(s[i:])) {
			i += 8
		}
		if i >= len(s) {
			break
		}
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = appendEscapedASCII(append(dst, s[start:i]...), b)
			i++
			start = i
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

// appendDouble appends f as the driver's formatDouble does.
func appendDouble(dst []byte, f float64) []byte {
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

// appendExtJSONDoc appends the Extended JSON of the BSON document doc.
func appendExtJSONDoc(dst []byte, doc []byte, canonical bool) ([]byte, error) {
	length, rem, ok := bsoncore.ReadLength(doc)
	if !ok || int(length) != len(doc) || length < 5 || doc[length-1] != 0 {
		return dst, errSlowPath
	}
	rem = rem[:len(rem)-1] // the terminating NUL
	dst = append(dst, '{')
	first := true
	for len(rem) > 0 {
		t := bson.Type(rem[0])
		rem = rem[1:]
		key, rest, ok := bsoncore.ReadKeyBytes(rem)
		if !ok {
			return dst, errSlowPath
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		if dst, ok = appendValidJSONString(dst, key); !ok {
			return dst, ErrInvalidUTF8
		}
		dst = append(dst, ':')
		var err error
		dst, rem, err = appendExtJSONValue(dst, t, rest, canonical)
		if err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

// appendExtJSONArray appends the Extended JSON of the BSON array arr.
func appendExtJSONArray(dst []byte, arr []byte, canonical bool) ([]byte, error) {
	length, rem, ok := bsoncore.ReadLength(arr)
	if !ok || int(length) != len(arr) || length < 5 || arr[length-1] != 0 {
		return dst, errSlowPath
	}
	rem = rem[:len(rem)-1]
	dst = append(dst, '[')
	first := true
	for len(rem) > 0 {
		t := bson.Type(rem[0])
		_, rest, ok := bsoncore.ReadKeyBytes(rem[1:])
		if !ok {
			return dst, errSlowPath
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		var err error
		dst, rem, err = appendExtJSONValue(dst, t, rest, canonical)
		if err != nil {
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

// readStringBytes is readString without the copy into a string.
func readStringBytes(src []byte) ([]byte, []byte, bool) {
	l, rem, ok := bsoncore.ReadLength(src)
	if !ok || l <= 0 || int(l) > len(rem) || rem[l-1] != 0 {
		return nil, src, false
	}
	return rem[:l-1], rem[l:], true
}

// readSubdoc returns the length-prefixed document at the start of src.
func readSubdoc(src []byte) ([]byte, []byte, bool) {
	l, _, ok := bsoncore.ReadLength(src)
	if !ok || l < 5 || int(l) > len(src) {
		return nil, src, false
	}
	return src[:l], src[l:], true
}

// appendExtJSONValue appends the value of type t at the start of src and
// returns the rest of src.
func appendExtJSONValue(dst []byte, t bson.Type, src []byte, canonical bool) ([]byte, []byte, error) {
	switch t {
	case bson.TypeDouble:
		f, rem, ok := bsoncore.ReadDouble(src)
		if !ok {
			return dst, src, errSlowPath
		}
		switch {
		case canonical:
			dst = append(dst, `{"$numberDouble":"`...)
			dst = appendDouble(dst, f)
			dst = append(dst, `"}`...)
		case math.IsInf(f, 0) || math.IsNaN(f):
			dst = append(dst, `{"$numberDouble":"`...)
			dst = appendDouble(dst, f)
			dst = append(dst, `"}`...)
		default:
			dst = appendDouble(dst, f)
		}
		return dst, rem, nil
	case bson.TypeString:
		s, rem, ok := readStringBytes(src)
		if !ok {
			return dst, src, errSlowPath
		}
		if dst, ok = appendValidJSONString(dst, s); !ok {
			return dst, src, ErrInvalidUTF8
		}
		return dst, rem, nil
	case bson.TypeEmbeddedDocument:
		doc, rem, ok := readSubdoc(src)
		if !ok {
			return dst, src, errSlowPath
		}
		dst, err := appendExtJSONDoc(dst, doc, canonical)
		return dst, rem, err
	case bson.TypeArray:
		arr, rem, ok := readSubdoc(src)
		if !ok {
			return dst, src, errSlowPath
		}
		dst, err := appendExtJSONArray(dst, arr, canonical)
		return dst, rem, err
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
	case bson.TypeObjectID:
		if len(src) < 12 {
			return dst, src, errSlowPath
		}
		dst = append(dst, `{"$oid":"`...)
		for _, b := range src[:12] {
			dst = append(dst, hexChars[b>>4], hexChars[b&0xF])
		}
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
		dt, rem, ok := bsoncore.ReadDateTime(src)
		if !ok {
			return dst, src, errSlowPath
		}
		tm := time.Unix(dt/1e3, dt%1e3*1e6).UTC()
		if canonical || tm.Year() < 1970 || tm.Year() > 9999 {
			dst = append(dst, `{"$date":{"$numberLong":"`...)
			dst = strconv.AppendInt(dst, dt, 10)
			dst = append(dst, `"}}`...)
		} else {
			dst = append(dst, `{"$date":"`...)
			dst = appendRFC3339UTC(dst, tm, 3)
			dst = append(dst, `"}`...)
		}
		return dst, rem, nil
	case bson.TypeNull:
		return append(dst, "null"...), src, nil
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
		for _, b := range rem[:12] {
			dst = append(dst, hexChars[b>>4], hexChars[b&0xF])
		}
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
	case bson.TypeInt32:
		i, rem, ok := bsoncore.ReadInt32(src)
		if !ok {
			return dst, src, errSlowPath
		}
		if canonical {
			dst = append(dst, `{"$numberInt":"`...)
			dst = strconv.AppendInt(dst, int64(i), 10)
			return append(dst, `"}`...), rem, nil
		}
		return strconv.AppendInt(dst, int64(i), 10), rem, nil
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
	case bson.TypeInt64:
		i, rem, ok := bsoncore.ReadInt64(src)
		if !ok {
			return dst, src, errSlowPath
		}
		if canonical {
			dst = append(dst, `{"$numberLong":"`...)
			dst = strconv.AppendInt(dst, i, 10)
			return append(dst, `"}`...), rem, nil
		}
		return strconv.AppendInt(dst, i, 10), rem, nil
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
