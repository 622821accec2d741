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
// driver's. Strings are escaped in jsonstring.go, doubles formatted in
// numfmt.go and dates in timefmt.go.

var errSlowPath = errors.New("extjson: not handled by the fast encoder")

// ErrInvalidUTF8 is returned (wrapped) by Event.Envelope for a change with
// a string or key that is not valid UTF-8. JSON cannot carry such bytes,
// and the driver's replacement by U+FFFD would lose them, so the event is
// not encoded: sinks fail it permanently (reason "encode") and the
// dead-letter entry keeps the change's raw BSON for inspection and replay.
var ErrInvalidUTF8 = errors.New("a string or key is not valid UTF-8")

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

// readValidString is readString for a string that must be valid UTF-8:
// errSlowPath when it is malformed, ErrInvalidUTF8 when it is not valid.
func readValidString(src []byte) (string, []byte, error) {
	s, rem, ok := readString(src)
	if !ok {
		return "", src, errSlowPath
	}
	if !utf8.ValidString(s) {
		return "", src, ErrInvalidUTF8
	}
	return s, rem, nil
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
			if dst, ok = appendJSONStringTail(dst, src[4:3+l], k-4, false); !ok {
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
	case bson.TypeJavaScript, bson.TypeSymbol:
		str, rem, err := readValidString(src)
		if err != nil {
			return dst, src, err
		}
		if t == bson.TypeJavaScript {
			dst = append(dst, `{"$code":`...)
		} else {
			dst = append(dst, `{"$symbol":`...)
		}
		dst = appendJSONString(dst, str)
		return append(dst, '}'), rem, nil
	case bson.TypeCodeWithScope:
		l, rem, ok := bsoncore.ReadLength(src)
		if !ok || l < 14 || int(l) > len(src) {
			return dst, src, errSlowPath
		}
		body := rem[:l-4]
		code, scope, err := readValidString(body)
		if err != nil {
			return dst, src, err
		}
		dst = append(dst, `{"$code":`...)
		dst = appendJSONString(dst, code)
		dst = append(dst, `,"$scope":`...)
		if dst, err = appendExtJSONDoc(dst, scope, canonical); err != nil {
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
