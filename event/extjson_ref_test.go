package event

// This file is the envelope encoder as it was before the fast reader
// (commit 2cbe5e5), kept verbatim under ref* names as the reference the
// differential tests compare the current encoder with, byte for byte and
// error for error.

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/changegate/changegate/internal/bsonraw"
)

func refEnvelopeCap(n int) int {
	if n < 64<<10 {
		return 128 + n*3/2
	}
	return 256 + n + n/8
}

// refAppendEscapedASCII appends the JSON escape of the ASCII byte b (a
// control character, '"' or '\\'), as the driver's writeStringWithEscapes
// writes it.
func refAppendEscapedASCII(dst []byte, b byte) []byte {
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

// refAppendJSONString appends s as a JSON string, escaped exactly as the
// driver's writeStringWithEscapes with escapeHTML false.
func refAppendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = refAppendEscapedASCII(append(dst, s[start:i]...), b)
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

// refPlainWord reports whether none of the eight bytes of w (a little-endian
// load of a string's bytes) needs a look of its own: no byte below 0x20,
// no '"', no '\\', no byte of a multi-byte UTF-8 sequence (>= 0x80). The
// tests are the classic has-less / has-zero bit tricks; they may report a
// byte that is fine (after a real hit in the same word), never miss one.
func refPlainWord(w uint64) bool {
	ctl := (w - swarOnes*0x20) &^ w
	q := w ^ (swarOnes * '"')
	quote := (q - swarOnes) &^ q
	bs := w ^ (swarOnes * '\\')
	back := (bs - swarOnes) &^ bs
	return (ctl|quote|back|w)&swarHigh == 0
}

// refAppendValidJSONString appends s as a JSON string escaped exactly as
// refAppendJSONString does, and checks in the same pass that s is valid
// UTF-8: it returns false (and dst holding a partial string) if not. It
// is the encoder's path for BSON strings and keys, where a document's
// bulk is: one pass, eight bytes at a time over runs that need no
// escaping, copied in one append per run into a destination grown once.
func refAppendValidJSONString(dst, s []byte) ([]byte, bool) {
	dst = slices.Grow(dst, len(s)+2)
	dst = append(dst, '"')
	start, i := 0, 0
	for i < len(s) {
		for i+8 <= len(s) && refPlainWord(binary.LittleEndian.Uint64(s[i:])) {
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
			dst = refAppendEscapedASCII(append(dst, s[start:i]...), b)
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

// refAppendDouble appends f as the driver's formatDouble does.
func refAppendDouble(dst []byte, f float64) []byte {
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

// refAppendExtJSONDoc appends the Extended JSON of the BSON document doc.
func refAppendExtJSONDoc(dst []byte, doc []byte, canonical bool) ([]byte, error) {
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
		if dst, ok = refAppendValidJSONString(dst, key); !ok {
			return dst, ErrInvalidUTF8
		}
		dst = append(dst, ':')
		var err error
		dst, rem, err = refAppendExtJSONValue(dst, t, rest, canonical)
		if err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

// refAppendExtJSONArray appends the Extended JSON of the BSON array arr.
func refAppendExtJSONArray(dst []byte, arr []byte, canonical bool) ([]byte, error) {
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
		dst, rem, err = refAppendExtJSONValue(dst, t, rest, canonical)
		if err != nil {
			return dst, err
		}
	}
	return append(dst, ']'), nil
}

// refReadString reads a BSON string as the driver's value reader does.
func refReadString(src []byte) (string, []byte, bool) {
	l, rem, ok := bsoncore.ReadLength(src)
	if !ok || l <= 0 || int(l) > len(rem) || rem[l-1] != 0 {
		return "", src, false
	}
	return string(rem[:l-1]), rem[l:], true
}

// refReadStringBytes is refReadString without the copy into a string.
func refReadStringBytes(src []byte) ([]byte, []byte, bool) {
	l, rem, ok := bsoncore.ReadLength(src)
	if !ok || l <= 0 || int(l) > len(rem) || rem[l-1] != 0 {
		return nil, src, false
	}
	return rem[:l-1], rem[l:], true
}

// refReadSubdoc returns the length-prefixed document at the start of src.
func refReadSubdoc(src []byte) ([]byte, []byte, bool) {
	l, _, ok := bsoncore.ReadLength(src)
	if !ok || l < 5 || int(l) > len(src) {
		return nil, src, false
	}
	return src[:l], src[l:], true
}

// refAppendExtJSONValue appends the value of type t at the start of src and
// returns the rest of src.
func refAppendExtJSONValue(dst []byte, t bson.Type, src []byte, canonical bool) ([]byte, []byte, error) {
	switch t {
	case bson.TypeDouble:
		f, rem, ok := bsoncore.ReadDouble(src)
		if !ok {
			return dst, src, errSlowPath
		}
		switch {
		case canonical:
			dst = append(dst, `{"$numberDouble":"`...)
			dst = refAppendDouble(dst, f)
			dst = append(dst, `"}`...)
		case math.IsInf(f, 0) || math.IsNaN(f):
			dst = append(dst, `{"$numberDouble":"`...)
			dst = refAppendDouble(dst, f)
			dst = append(dst, `"}`...)
		default:
			dst = refAppendDouble(dst, f)
		}
		return dst, rem, nil
	case bson.TypeString:
		s, rem, ok := refReadStringBytes(src)
		if !ok {
			return dst, src, errSlowPath
		}
		if dst, ok = refAppendValidJSONString(dst, s); !ok {
			return dst, src, ErrInvalidUTF8
		}
		return dst, rem, nil
	case bson.TypeEmbeddedDocument:
		doc, rem, ok := refReadSubdoc(src)
		if !ok {
			return dst, src, errSlowPath
		}
		dst, err := refAppendExtJSONDoc(dst, doc, canonical)
		return dst, rem, err
	case bson.TypeArray:
		arr, rem, ok := refReadSubdoc(src)
		if !ok {
			return dst, src, errSlowPath
		}
		dst, err := refAppendExtJSONArray(dst, arr, canonical)
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
			dst = refAppendRFC3339UTC(dst, tm, 3)
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
		dst = refAppendJSONString(dst, pattern)
		dst = append(dst, `,"options":`...)
		dst = refAppendJSONString(dst, string(runes))
		return append(dst, `}}`...), rem, nil
	case bson.TypeDBPointer:
		ns, rem, ok := refReadString(src)
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
		code, rem, ok := refReadString(src)
		if !ok {
			return dst, src, errSlowPath
		}
		if !utf8.ValidString(code) {
			return dst, src, ErrInvalidUTF8
		}
		dst = append(dst, `{"$code":`...)
		dst = refAppendJSONString(dst, code)
		return append(dst, '}'), rem, nil
	case bson.TypeSymbol:
		sym, rem, ok := refReadString(src)
		if !ok {
			return dst, src, errSlowPath
		}
		if !utf8.ValidString(sym) {
			return dst, src, ErrInvalidUTF8
		}
		dst = append(dst, `{"$symbol":`...)
		dst = refAppendJSONString(dst, sym)
		return append(dst, '}'), rem, nil
	case bson.TypeCodeWithScope:
		l, rem, ok := bsoncore.ReadLength(src)
		if !ok || l < 14 || int(l) > len(src) {
			return dst, src, errSlowPath
		}
		body := rem[:l-4]
		code, scope, ok := refReadString(body)
		if !ok {
			return dst, src, errSlowPath
		}
		if !utf8.ValidString(code) {
			return dst, src, ErrInvalidUTF8
		}
		dst = append(dst, `{"$code":`...)
		dst = refAppendJSONString(dst, code)
		dst = append(dst, `,"$scope":`...)
		dst, err := refAppendExtJSONDoc(dst, scope, canonical)
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

// refAppendRFC3339UTC appends t (whose location must be UTC) as
// t.AppendFormat would with time.RFC3339 (fracDigits 0), rfc3339Milli (3)
// or time.RFC3339Nano (9): the fraction of a second to at most fracDigits
// digits, trailing zeros (and a lone dot) trimmed, then "Z". It is the
// encoder's fast path for the timestamps of every envelope (clusterTime,
// wallTime, $date); a year outside 0..9999 goes through AppendFormat.
func refAppendRFC3339UTC(dst []byte, t time.Time, fracDigits int) []byte {
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		layout := time.RFC3339Nano
		switch fracDigits {
		case 0:
			layout = time.RFC3339
		case 3:
			layout = rfc3339Milli
		}
		return t.AppendFormat(dst, layout)
	}
	hour, minute, sec := t.Clock()
	dst = append(dst,
		byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+int(month)/10), byte('0'+int(month)%10), '-',
		byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':',
		byte('0'+minute/10), byte('0'+minute%10), ':',
		byte('0'+sec/10), byte('0'+sec%10))
	if fracDigits > 0 {
		frac := t.Nanosecond()
		for range 9 - fracDigits {
			frac /= 10
		}
		if frac != 0 {
			var buf [9]byte
			n := fracDigits
			for i := n - 1; i >= 0; i-- {
				buf[i] = byte('0' + frac%10)
				frac /= 10
			}
			for n > 0 && buf[n-1] == '0' {
				n--
			}
			dst = append(dst, '.')
			dst = append(dst, buf[:n]...)
		}
	}
	return append(dst, 'Z')
}

func (e *Event) refEncode(canonical bool) ([]byte, error) {
	if canonical {
		if path := bsonraw.DollarPath(e.Raw); path != "" {
			return nil, fmt.Errorf("event %s: field %q: %w", e.ID, path, ErrAmbiguousJSON)
		}
	}
	b, err := e.refEncodeFast(canonical)
	switch {
	case err == nil:
		return b, nil
	case errors.Is(err, ErrInvalidUTF8):
		return nil, fmt.Errorf("event %s: encode envelope: %w", e.ID, err)
	}
	return e.encodeDriver(canonical)
}

// encodeFast encodes the envelope with the direct encoder of extjson.go;
// it fails (and encode falls back to encodeDriver) on malformed BSON.
func (e *Event) refEncodeFast(canonical bool) ([]byte, error) {
	if !utf8.ValidString(e.ID) || !utf8.ValidString(e.OperationType) {
		return nil, ErrInvalidUTF8
	}
	b := make([]byte, 0, refEnvelopeCap(len(e.Raw)))
	b = append(b, `{"id":`...)
	b = refAppendJSONString(b, e.ID)
	b = append(b, `,"source":`...)
	b = refAppendJSONString(b, e.Source)
	b = append(b, `,"operationType":`...)
	b = refAppendJSONString(b, e.OperationType)
	// One pass over the change finds the envelope fields (the first
	// occurrence of each, as LookupErr would).
	var vals [len(envelopeFields)]bsoncore.Value
	var found [len(envelopeFields)]bool
	doc := bsoncore.Document(e.Raw)
	if len(doc) < 5 {
		return nil, errSlowPath
	}
	for rem := doc[4 : len(doc)-1]; len(rem) > 0; {
		el, rest, ok := bsoncore.ReadElement(rem)
		if !ok {
			return nil, errSlowPath
		}
		rem = rest
		if i := envelopeField(el.KeyBytes()); i >= 0 && !found[i] {
			vals[i], found[i] = el.Value(), true
		}
	}
	for i, k := range envelopeFields {
		if !found[i] {
			continue
		}
		b = append(b, ',')
		b = refAppendJSONString(b, k)
		b = append(b, ':')
		var err error
		if b, _, err = refAppendExtJSONValue(b, bson.Type(vals[i].Type), vals[i].Data, canonical); err != nil {
			return nil, err
		}
	}
	if e.ClusterTime.T != 0 {
		b = append(b, `,"clusterTime":"`...)
		b = refAppendRFC3339UTC(b, time.Unix(int64(e.ClusterTime.T), 0).UTC(), 0)
		b = append(b, '"')
	}
	if !e.WallTime.IsZero() {
		// RFC 3339 needs no JSON escaping.
		b = append(b, `,"wallTime":"`...)
		if e.WallTime.Location() == time.UTC {
			b = refAppendRFC3339UTC(b, e.WallTime, 9)
		} else {
			b = e.WallTime.AppendFormat(b, time.RFC3339Nano)
		}
		b = append(b, '"')
	}
	if e.Txn != nil {
		b = append(b, `,"txn":`...)
		b = refAppendTxnJSON(b, e.Txn)
	}
	b = append(b, `,"rules":[`...)
	for i, r := range e.Rules {
		if i > 0 {
			b = append(b, ',')
		}
		b = refAppendJSONString(b, r)
	}
	return append(b, "]}"...), nil
}

func refAppendTxnJSON(b []byte, t *Txn) []byte {
	b = append(b, `{"id":`...)
	b = refAppendJSONString(b, t.ID)
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(t.Index), 10)
	if t.Last {
		b = append(b, `,"last":true`...)
	}
	return append(b, '}')
}

// refScanChange finds the fields refFromChange reads in one pass over raw, with
// the results raw.LookupErr would give for each: the first occurrence of a
// key, and nothing from a malformed element on.
func refScanChange(raw bson.Raw) (vals [chFields]bsoncore.Value, found [chFields]bool) {
	length, rem, ok := bsoncore.ReadLength(raw)
	if !ok {
		return vals, found
	}
	length -= 4
	for length > 1 {
		el, rest, ok := bsoncore.ReadElement(rem)
		length -= int32(len(el))
		if !ok {
			return vals, found
		}
		rem = rest
		if i := changeField(el.KeyBytes()); i >= 0 && !found[i] {
			// A value that cannot be read stays the zero Value (type 0):
			// found, but of no usable type, as LookupErr's error.
			found[i] = true
			if v, err := el.ValueErr(); err == nil {
				vals[i] = v
			}
		}
	}
	return vals, found
}

// refStringBytes returns the bytes of a BSON string value, with the checks of
// bsoncore's Value.StringValueOK, without allocating.
func refStringBytes(v bsoncore.Value) ([]byte, bool) {
	if v.Type != bsoncore.TypeString {
		return nil, false
	}
	l, rem, ok := bsoncore.ReadLength(v.Data)
	if !ok || len(rem) < int(l) || l <= 0 {
		return nil, false
	}
	return rem[:l-1], true
}

// refTokenData returns TokenData(token) as bytes when the token has a _data
// string (without allocating), or nil, false.
func refTokenData(token bson.Raw) ([]byte, bool) {
	v, err := bsoncore.Document(token).LookupErr("_data")
	if err != nil {
		return nil, false
	}
	return refStringBytes(v)
}

// refFromChange builds an Event from a raw change stream document. seq is the
// position assigned by the source.
// refFromChange is FromChange as of 2cbe5e5.
func refFromChange(source string, seq uint64, raw bson.Raw) (*Event, error) {
	vals, found := refScanChange(raw)
	if !found[chID] || vals[chID].Type == 0 {
		return nil, fmt.Errorf("change event has no _id (resume token)")
	}
	idv := bson.RawValue{Type: bson.Type(vals[chID].Type), Value: vals[chID].Data}
	tok, ok := idv.DocumentOK()
	if !ok {
		return nil, fmt.Errorf("change event _id is a %s, not a document", idv.Type)
	}
	e := &Event{
		Source: source,
		Seq:    seq,
		Token:  tok,
		Raw:    raw,
	}
	// The event's strings (id, operation type, database, collection) share
	// one allocation.
	data, hasData := refTokenData(tok)
	var op, db, coll []byte
	if found[chOperationType] {
		op, _ = refStringBytes(vals[chOperationType])
	}
	if found[chNS] {
		// As raw.LookupErr("ns", "db"): ns may be a document or an array.
		if ns := vals[chNS]; ns.Type == bsoncore.TypeEmbeddedDocument || ns.Type == bsoncore.TypeArray {
			if v, err := bsoncore.Document(ns.Data).LookupErr("db"); err == nil {
				db, _ = refStringBytes(v)
			}
			if v, err := bsoncore.Document(ns.Data).LookupErr("coll"); err == nil {
				coll, _ = refStringBytes(v)
			}
		}
	}
	var sb strings.Builder
	if hasData {
		sb.Grow(len(source) + 1 + len(data) + len(op) + len(db) + len(coll))
		sb.WriteString(source)
		sb.WriteByte(':')
		sb.Write(data)
	} else {
		sb.Grow(len(op) + len(db) + len(coll))
	}
	sb.Write(op)
	sb.Write(db)
	sb.Write(coll)
	all := sb.String()
	n := 0
	if hasData {
		n = len(source) + 1 + len(data)
		e.ID = all[:n]
	} else {
		e.ID = MakeID(source, tok)
	}
	e.OperationType = all[n : n+len(op)]
	n += len(op)
	e.DB = all[n : n+len(db)]
	n += len(db)
	e.Coll = all[n : n+len(coll)]
	if found[chDocumentKey] {
		e.DocumentKey, _ = bson.RawValue{Type: bson.Type(vals[chDocumentKey].Type), Value: vals[chDocumentKey].Data}.DocumentOK()
	}
	if found[chClusterTime] {
		t, i, _ := vals[chClusterTime].TimestampOK()
		e.ClusterTime = bson.Timestamp{T: t, I: i}
	}
	if found[chWallTime] {
		if dt, ok := vals[chWallTime].DateTimeOK(); ok {
			e.WallTime = time.UnixMilli(dt).UTC()
		}
	}
	if e.WallTime.IsZero() && e.ClusterTime.T != 0 {
		e.WallTime = time.Unix(int64(e.ClusterTime.T), 0).UTC()
	}
	return e, nil
}

// refTxnID is TxnID as of 2cbe5e5.
func refTxnID(raw []byte) (id string, ok bool) {
	lv, err := bsoncore.Document(raw).LookupErr("lsid")
	if err != nil || lv.Type != bsoncore.TypeEmbeddedDocument {
		return "", false
	}
	nv, err := bsoncore.Document(raw).LookupErr("txnNumber")
	if err != nil {
		return "", false
	}
	var number int64
	switch nv.Type {
	case bsoncore.TypeInt64:
		number = nv.Int64()
	case bsoncore.TypeInt32:
		number = int64(nv.Int32())
	default:
		return "", false
	}
	lsid := bsoncore.Document(lv.Data)
	var sidBytes, uidBytes []byte
	if v, err := lsid.LookupErr("id"); err == nil && v.Type == bsoncore.TypeBinary {
		_, sidBytes, _ = v.BinaryOK()
		if u, err := lsid.LookupErr("uid"); err == nil && u.Type == bsoncore.TypeBinary {
			_, uidBytes, _ = u.BinaryOK()
		}
	} else {
		sidBytes = lsid
	}
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint32(n[:4], uint32(len(sidBytes)))
	h.Write(n[:4])
	h.Write(sidBytes)
	binary.BigEndian.PutUint32(n[:4], uint32(len(uidBytes)))
	h.Write(n[:4])
	h.Write(uidBytes)
	binary.BigEndian.PutUint64(n[:], uint64(number))
	h.Write(n[:])
	sum := h.Sum(nil)
	return hex.EncodeToString(sum[:16]), true
}
