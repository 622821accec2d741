package event

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/changegate/changegate/internal/bsonraw"
)

// The differential tests of this file hold the encoder to the one it
// replaced (extjson_ref_test.go, kept verbatim): for random and unusual
// BSON (every type, odd strings and keys, special doubles and dates,
// deep nesting, and corrupted bytes) the envelope, the event FromChange
// builds and every error must be the same, byte for byte.

// genStringPieces are the parts random strings and keys are made of: plain
// runs, every JSON escape, bytes next to the table and SWAR boundaries,
// multi-byte runes, U+2028/9, and invalid UTF-8.
var genStringPieces = []string{
	"a", "z", "Z", "0", " ", "!", "#", "~", "\x7f", "\"", "\\", "/", "<", ">", "&", "\n", "\r", "\t", "\b", "\f",
	"\x01", "\x1f", "\x00", "é", "ß", "ÿ", "Ω", "я", "世界", "😀", "\u2028", "\u2029", "\u2027", "\u202a", "\ufffd", "\uffff",
	"abcdefgh", "customer-000042", "0123456789012345678", "$", "$oid", ".", "_id",
}

// genInvalidPieces are invalid UTF-8; one string in about forty holds one,
// so that most changes are encoded whole and many are refused.
var genInvalidPieces = []string{
	"\xff", "\xc3", "\xc0\x80", "\xc1\xbf", "\xe4\xb8", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80", "\xe2\x80", "\xe2\x80\xa8x",
}

type docGen struct {
	r *rand.Rand
}

func (g docGen) str(maxPieces int) string {
	var sb strings.Builder
	for k := g.r.IntN(maxPieces + 1); k > 0; k-- {
		sb.WriteString(genStringPieces[g.r.IntN(len(genStringPieces))])
	}
	if g.r.IntN(40) == 0 {
		sb.WriteString(genInvalidPieces[g.r.IntN(len(genInvalidPieces))])
		sb.WriteString(genStringPieces[g.r.IntN(len(genStringPieces))])
	}
	return sb.String()
}

// plainStr is a string of printable ASCII (or a valid rune) only.
func (g docGen) plainStr(n int) string {
	var sb strings.Builder
	for k := g.r.IntN(n + 1); k > 0; k-- {
		switch g.r.IntN(8) {
		case 0:
			sb.WriteString("é")
		default:
			sb.WriteByte(byte(0x20 + g.r.IntN(0x5f)))
		}
	}
	return sb.String()
}

func (g docGen) key() string {
	switch g.r.IntN(10) {
	case 0:
		s := g.str(3)
		return strings.ReplaceAll(s, "\x00", "") // a key cannot hold NUL
	case 1:
		if g.r.IntN(20) == 0 {
			return "$" + g.plainStr(4)
		}
		return g.plainStr(30)
	case 2:
		return ""
	default:
		return strings.ReplaceAll(g.plainStr(12), "\x00", "")
	}
}

func (g docGen) double() float64 {
	switch g.r.IntN(12) {
	case 0:
		return []float64{math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1), 0, math.MaxFloat64, math.SmallestNonzeroFloat64,
			-math.MaxFloat64, 1e6, 999999, 999999.5, 1e-4, 0.0001, 0.00009999999999999999, 1e21, 1e-7, 123456789012345680,
			1e15, 1e16, 0.1 + 0.2, 1.0 / 3, 2.5e-5, 9007199254740993, -1e6 + 0.5}[g.r.IntN(24)]
	case 1:
		return math.Float64frombits(g.r.Uint64())
	case 2:
		return float64(g.r.IntN(2000000) - 1000000)
	case 3, 4, 5:
		// A short decimal: m / 10^k with a few digits.
		m := g.r.Int64N(pow10Int(1 + g.r.IntN(15)))
		f, _ := strconv.ParseFloat(strconv.FormatInt(m, 10)+"e-"+strconv.Itoa(g.r.IntN(19)), 64)
		if g.r.IntN(2) == 0 {
			f = -f
		}
		return f
	case 6:
		return g.r.Float64() * math.Pow(10, float64(g.r.IntN(30)-10))
	case 7:
		f := float64(g.r.IntN(100000)) / 100
		return math.Nextafter(f, math.Inf(2*g.r.IntN(2)-1))
	}
	return g.r.NormFloat64() * 1000
}

func pow10Int(n int) int64 {
	p := int64(1)
	for range n {
		p *= 10
	}
	return p
}

func (g docGen) date() int64 {
	switch g.r.IntN(6) {
	case 0:
		return []int64{0, -1, 1, 999, 1000, -1000, 253402300799999, 253402300800000, 253402300800001, math.MaxInt64, math.MinInt64,
			-62135596800000, -62135596800001, 1764150000000}[g.r.IntN(14)]
	case 1:
		return int64(g.r.Uint64())
	case 2:
		return g.r.Int64N(253402300800000)
	case 3:
		return g.r.Int64N(253402300800000) / 1000 * 1000
	}
	return 1700000000000 + g.r.Int64N(1e11)
}

func (g docGen) appendValue(b *bsoncore.DocumentBuilder, key string, depth int) {
	r := g.r
	switch t := r.IntN(28); {
	case t < 5:
		b.AppendString(key, g.str(6))
	case t < 7:
		b.AppendString(key, g.plainStr(40))
	case t < 9:
		b.AppendInt32(key, int32(r.Uint32()>>uint(r.IntN(32))))
	case t < 11:
		b.AppendDouble(key, g.double())
	case t == 11:
		b.AppendInt64(key, int64(r.Uint64()>>uint(r.IntN(64))))
	case t == 12:
		b.AppendDateTime(key, g.date())
	case t == 13 && depth < 6:
		b.AppendDocument(key, g.doc(depth+1, r.IntN(6)))
	case t == 14 && depth < 6:
		b.AppendArray(key, g.arr(depth+1, r.IntN(6)))
	case t == 15:
		var oid bson.ObjectID
		for i := range oid {
			oid[i] = byte(r.Uint32())
		}
		b.AppendObjectID(key, oid)
	case t == 16:
		b.AppendBoolean(key, r.IntN(2) == 0)
	case t == 17:
		b.AppendNull(key)
	case t == 18:
		data := make([]byte, r.IntN(40))
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		sub := []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0x80, 0xff}[r.IntN(12)]
		b.AppendBinary(key, sub, data)
	case t == 19:
		b.AppendTimestamp(key, r.Uint32(), r.Uint32())
	case t == 20:
		opts := []string{"", "i", "xsmi", "mix", "ux", "\xff", "é"}[r.IntN(7)]
		b.AppendRegex(key, strings.ReplaceAll(g.str(4), "\x00", ""), opts)
	case t == 21:
		var oid bson.ObjectID
		oid[3] = byte(r.Uint32())
		b.AppendDBPointer(key, strings.ReplaceAll(g.str(3), "\x00", ""), oid)
	case t == 22:
		b.AppendJavaScript(key, g.str(4))
	case t == 23:
		b.AppendSymbol(key, g.str(4))
	case t == 24 && depth < 6:
		b.AppendCodeWithScope(key, g.str(3), g.doc(depth+1, r.IntN(3)))
	case t == 25:
		d, err := bson.ParseDecimal128([]string{"0", "-0", "1.000", "NaN", "-Infinity", "1E-6176", "123456789.0123456789", "-1234.5678E-10"}[r.IntN(8)])
		if err != nil {
			panic(err)
		}
		h, l := d.GetBytes()
		if r.IntN(3) == 0 {
			h, l = r.Uint64(), r.Uint64()
		}
		b.AppendDecimal128(key, h, l)
	case t == 26:
		switch r.IntN(3) {
		case 0:
			b.AppendMinKey(key)
		case 1:
			b.AppendMaxKey(key)
		default:
			b.AppendUndefined(key)
		}
	default:
		b.AppendInt32(key, int32(r.IntN(100)))
	}
}

func (g docGen) doc(depth, n int) []byte {
	b := bsoncore.NewDocumentBuilder()
	for range n {
		g.appendValue(b, g.key(), depth)
	}
	return b.Build()
}

func (g docGen) arr(depth, n int) []byte {
	b := bsoncore.NewDocumentBuilder()
	for i := range n {
		g.appendValue(b, strconv.Itoa(i), depth)
	}
	return b.Build()
}

// change builds a change event around random documents.
func (g docGen) change() []byte {
	r := g.r
	b := bsoncore.NewDocumentBuilder()
	switch r.IntN(8) {
	case 0: // a token of another shape, or an odd _data
		b.AppendDocument("_id", g.doc(0, r.IntN(3)))
	case 1:
		b.AppendDocument("_id", bsoncore.NewDocumentBuilder().AppendString("_data", g.str(4)).Build())
	default:
		b.AppendDocument("_id", bsoncore.NewDocumentBuilder().AppendString("_data", "8266A1B2C3000000012B022C0100296E5A1004").Build())
	}
	if r.IntN(8) == 0 {
		b.AppendString("operationType", g.str(3))
	} else {
		b.AppendString("operationType", []string{"insert", "update", "delete", "replace", "drop", "op\"x\n"}[r.IntN(6)])
	}
	if r.IntN(4) == 0 { // a transaction's change
		uuid := make([]byte, 16)
		for i := range uuid {
			uuid[i] = byte(r.Uint32())
		}
		lsid := bsoncore.NewDocumentBuilder().AppendBinary("id", 4, uuid)
		if r.IntN(2) == 0 {
			lsid.AppendBinary("uid", 0, uuid[:r.IntN(16)])
		}
		b.AppendDocument("lsid", lsid.Build())
		if r.IntN(2) == 0 {
			b.AppendInt64("txnNumber", r.Int64N(1000))
		} else {
			b.AppendInt32("txnNumber", r.Int32N(1000))
		}
	}
	if r.IntN(4) > 0 {
		b.AppendTimestamp("clusterTime", r.Uint32(), r.Uint32())
	}
	if r.IntN(4) > 0 {
		b.AppendDateTime("wallTime", g.date())
	}
	fields := []string{"fullDocument", "ns", "documentKey", "fullDocumentBeforeChange", "updateDescription", "to", "collectionUUID", "txnNumber", "lsid", "other"}
	r.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
	for _, f := range fields[:r.IntN(len(fields)+1)] {
		switch {
		case f == "ns" && r.IntN(4) > 0:
			b.AppendDocument(f, bsoncore.NewDocumentBuilder().AppendString("db", g.plainStr(6)).AppendString("coll", g.str(3)).Build())
		case r.IntN(5) == 0:
			g.appendValue(b, f, 0)
		default:
			b.AppendDocument(f, g.doc(0, r.IntN(12)))
		}
		if r.IntN(10) == 0 { // a duplicate key: the first one counts
			b.AppendDocument(f, g.doc(0, 1))
		}
	}
	return b.Build()
}

// corrupt returns a copy of raw with a few bytes changed, cut short or
// with a length field rewritten.
func (g docGen) corrupt(raw []byte) []byte {
	r := g.r
	out := bytes.Clone(raw)
	for k := 1 + r.IntN(3); k > 0 && len(out) > 0; k-- {
		i := r.IntN(len(out))
		switch r.IntN(5) {
		case 0:
			out[i] = byte(r.Uint32())
		case 1:
			out[i] ^= 1 << uint(r.IntN(8))
		case 2:
			if i+4 <= len(out) {
				binary.LittleEndian.PutUint32(out[i:], uint32([]int32{-1, 0, 1, 4, 5, math.MaxInt32, math.MinInt32, int32(r.IntN(64))}[r.IntN(8)]))
			}
		case 3:
			out[i] = 0
		default:
			out = out[:i]
		}
	}
	return out
}

// errClass names what an encoder error makes encode do.
func errClass(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, ErrInvalidUTF8):
		return "utf8"
	case errors.Is(err, errSlowPath):
		return "slow"
	}
	return "other: " + err.Error()
}

// sameEvent compares what FromChange and refFromChange made of raw.
func sameAsRefEvent(t *testing.T, raw []byte) (*Event, *Event) {
	t.Helper()
	e, err := FromChange("src\"é", 7, bson.Raw(raw))
	re, rerr := refFromChange("src\"é", 7, bson.Raw(raw))
	if (err == nil) != (rerr == nil) || (err != nil && err.Error() != rerr.Error()) {
		t.Fatalf("FromChange error %v, reference %v\nraw %x", err, rerr, raw)
	}
	if err != nil {
		return nil, nil
	}
	if e.ID != re.ID || e.Source != re.Source || e.Seq != re.Seq || e.OperationType != re.OperationType ||
		e.DB != re.DB || e.Coll != re.Coll || !bytes.Equal(e.Token, re.Token) || !bytes.Equal(e.DocumentKey, re.DocumentKey) ||
		(e.DocumentKey == nil) != (re.DocumentKey == nil) || e.ClusterTime != re.ClusterTime || !e.WallTime.Equal(re.WallTime) ||
		e.WallTime.Location() != re.WallTime.Location() || !bytes.Equal(e.Raw, re.Raw) {
		t.Fatalf("FromChange differs from the reference:\n%+v\n%+v\nraw %x", e, re, raw)
	}
	if id, ok := TxnID(raw); true {
		rid, rok := refTxnID(raw)
		if id != rid || ok != rok {
			t.Fatalf("TxnID = %q, %v; reference %q, %v\nraw %x", id, ok, rid, rok, raw)
		}
	}
	return e, re
}

// checkSameAsReference encodes the change raw with the encoder and its
// reference, both formats, and fails on any difference of bytes or error.
func checkSameAsReference(t *testing.T, raw []byte) {
	t.Helper()
	e, re := sameAsRefEvent(t, raw)
	if e == nil {
		return
	}
	e.Rules, re.Rules = []string{"r1", "é\"\n"}, []string{"r1", "é\"\n"}
	for _, canonical := range []bool{false, true} {
		got, gerr := e.encodeFast(canonical)
		want, werr := re.refEncodeFast(canonical)
		if errClass(gerr) != errClass(werr) || !bytes.Equal(got, want) {
			t.Fatalf("encodeFast (canonical %v):\n got %s (%v)\nwant %s (%v)\nraw %x", canonical, got, gerr, want, werr, raw)
		}
		got, gerr = e.encode(canonical)
		want, werr = re.refEncode(canonical)
		if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) || !bytes.Equal(got, want) {
			t.Fatalf("encode (canonical %v):\n got %s (%v)\nwant %s (%v)\nraw %x", canonical, got, gerr, want, werr, raw)
		}
		// Encoded straight into a request (an event of one sink): the
		// same bytes after what dst held, the same error, dst kept on one.
		e.Exclusive = true
		got, gerr = e.AppendRecord([]byte("x"), canonical)
		e.Exclusive = false
		if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) || !bytes.Equal(got, append([]byte("x"), want...)) {
			t.Fatalf("AppendRecord (canonical %v):\n got %s (%v)\nwant x%s (%v)\nraw %x", canonical, got, gerr, want, werr, raw)
		}
	}
	// Each top-level value on its own, as the shaped forms encode them.
	for rem := raw; len(rem) > 5; {
		el, rest, ok := bsoncore.ReadElement(rem[4:])
		if !ok {
			break
		}
		v := el.Value()
		checkValueSameAsReference(t, bson.Type(v.Type), v.Data)
		rem = append([]byte{0, 0, 0, 0}, rest...)
	}
}

func checkValueSameAsReference(t *testing.T, typ bson.Type, data []byte) {
	t.Helper()
	for _, canonical := range []bool{false, true} {
		got, grest, gerr := appendExtJSONValue([]byte("x"), typ, data, canonical)
		want, wrest, werr := refAppendExtJSONValue([]byte("x"), typ, data, canonical)
		if errClass(gerr) != errClass(werr) || (gerr == nil && (!bytes.Equal(got, want) || len(grest) != len(wrest))) {
			t.Fatalf("appendExtJSONValue(%s, canonical %v):\n got %s rest %d (%v)\nwant %s rest %d (%v)\ndata %x",
				typ, canonical, got, len(grest), gerr, want, len(wrest), werr, data)
		}
	}
	if typ == bson.TypeEmbeddedDocument {
		if p := bsonraw.DollarPath(data); p != "" && !mayHaveDollarKey(data) {
			t.Fatalf("mayHaveDollarKey false for a document with %q: %x", p, data)
		}
	}
}

// TestEncoderMatchesReference is the differential test over random
// changes and their corruptions (FuzzEncoderMatchesReference goes on
// from here with go test -fuzz).
func TestEncoderMatchesReference(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	g := docGen{rand.New(rand.NewPCG(28, uint64(time.Now().UnixNano())))}
	for range n {
		raw := g.change()
		checkSameAsReference(t, raw)
		for range 3 {
			checkSameAsReference(t, g.corrupt(raw))
		}
	}
	// The fixed documents of the other tests.
	full := allTypesDoc(t)
	checkSameAsReference(t, changeWith(t, full, bson.E{Key: "fullDocumentBeforeChange", Value: full}))
	checkSameAsReference(t, benchChange(t))
	checkSameAsReference(t, largeChange(t, 100<<10))
}

// FuzzEncoderMatchesReference feeds arbitrary bytes both as a whole change
// and as the fullDocument of a change: the encoder, FromChange and TxnID
// must do what the reference does.
func FuzzEncoderMatchesReference(f *testing.F) {
	g := docGen{rand.New(rand.NewPCG(1, 2))}
	for range 20 {
		f.Add(g.change())
	}
	f.Add([]byte(allTypesDoc(f)))
	f.Add([]byte(benchChange(f)))
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkSameAsReference(t, raw)
		spliced := bsoncore.NewDocumentBuilder().
			AppendDocument("_id", bsoncore.NewDocumentBuilder().AppendString("_data", "82").Build()).
			AppendString("operationType", "insert").
			AppendDocument("fullDocument", raw).
			AppendDocument("updateDescription", raw).
			Build()
		checkSameAsReference(t, spliced)
		checkValueSameAsReference(t, bson.TypeEmbeddedDocument, raw)
		checkValueSameAsReference(t, bson.TypeArray, raw)
	})
}

// TestAppendDoubleMatchesStrconv checks appendDouble (and its short
// path) against the driver's formatDouble (refAppendDouble) on special
// values, random bit patterns and random short decimals.
func TestAppendDoubleMatchesStrconv(t *testing.T) {
	g := docGen{rand.New(rand.NewPCG(3, uint64(time.Now().UnixNano())))}
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	check := func(f float64) {
		got := appendDouble([]byte("x"), f)
		want := refAppendDouble([]byte("x"), f)
		if !bytes.Equal(got, want) {
			t.Fatalf("appendDouble(%v) = %s, want %s (bits %x)", f, got, want, math.Float64bits(f))
		}
	}
	for range n {
		f := g.double()
		check(f)
		check(math.Nextafter(f, math.Inf(1)))
		check(math.Nextafter(f, math.Inf(-1)))
	}
	// Every k-place decimal boundary around the short path's limits.
	for k := range 19 {
		for _, m := range []float64{1, 5, 9, 99, 999999, 999999999999999, 1e15, 1e15 + 1} {
			f := m / math.Pow(10, float64(k))
			check(f)
			check(-f)
			check(math.Nextafter(f, 0))
			check(math.Nextafter(f, 2e6))
		}
	}
}

// TestDateSecsMatchesTime checks appendDateSecs against package time on
// the first and last day of each month and March 1 of every year from
// 1970 to 9999 (at a random second of each day), on random instants, and
// on the first and last second of the range.
func TestDateSecsMatchesTime(t *testing.T) {
	r := rand.New(rand.NewPCG(5, uint64(time.Now().UnixNano())))
	check := func(secs int64) {
		got := appendDateSecs(nil, secs)
		want := time.Unix(secs, 0).UTC().AppendFormat(nil, "2006-01-02T15:04:05")
		if !bytes.Equal(got, want) {
			t.Fatalf("appendDateSecs(%d) = %s, want %s", secs, got, want)
		}
	}
	check(0)
	check(maxDate - 1)
	for y := 1970; y <= 9999; y++ {
		for m := time.January; m <= time.December; m++ {
			first := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC).Unix()
			check(first + r.Int64N(86400))
			if first > 0 {
				check(first - 86400 + r.Int64N(86400)) // the last day of the month before
			}
		}
	}
	for range 100000 {
		check(r.Int64N(maxDate))
	}
}

// TestTimeRFC3339MatchesFormat checks the wall time formatter against
// AppendFormat in UTC and another zone, inside and outside years 1970 to
// 9999.
func TestTimeRFC3339MatchesFormat(t *testing.T) {
	r := rand.New(rand.NewPCG(6, uint64(time.Now().UnixNano())))
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		paris = time.FixedZone("X", 3600)
	}
	for range 100000 {
		sec := r.Int64N(2*maxDate) - maxDate/2
		ns := r.Int64N(1e9)
		switch r.IntN(3) {
		case 0:
			ns = ns / 1e6 * 1e6
		case 1:
			ns = 0
		}
		for _, tm := range []time.Time{time.Unix(sec, ns).UTC(), time.Unix(sec, ns).In(paris)} {
			got := appendTimeRFC3339(nil, tm)
			want := tm.AppendFormat(nil, time.RFC3339Nano)
			if !bytes.Equal(got, want) {
				t.Fatalf("appendTimeRFC3339(%v) = %s, want %s", tm, got, want)
			}
		}
	}
}

// TestReadElementMatchesDriver checks readElement and lookup against
// bsoncore's ReadElement and LookupErr on random and corrupted documents.
func TestReadElementMatchesDriver(t *testing.T) {
	g := docGen{rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))}
	for range 5000 {
		raw := g.change()
		if g.r.IntN(2) == 0 {
			raw = g.corrupt(raw)
		}
		checkReadElement(t, raw)
	}
}

func checkReadElement(t *testing.T, raw []byte) {
	t.Helper()
	for off := 0; off < len(raw); off++ {
		el, rest, ok := readElement(raw[off:])
		del, drest, dok := bsoncore.ReadElement(raw[off:])
		if ok != dok || len(rest) != len(drest) {
			t.Fatalf("readElement at %d: ok %v rest %d; driver %v %d\nraw %x", off, ok, len(rest), dok, len(drest), raw)
		}
		if !ok {
			continue
		}
		v, vok := el.coreValue()
		dv, verr := del.ValueErr()
		if el.size != len(del) || string(el.key) != string(del.KeyBytes()) || el.t != del[0] || vok != (verr == nil) || v.Type != dv.Type || !bytes.Equal(v.Data, dv.Data) {
			t.Fatalf("readElement at %d differs from the driver's\nraw %x", off, raw)
		}
	}
	same := func(v bsoncore.Value, ok bool, key string) {
		t.Helper()
		dv, err := bsoncore.Document(raw).LookupErr(key)
		if ok != (err == nil) || (ok && (v.Type != dv.Type || !bytes.Equal(v.Data, dv.Data))) {
			t.Fatalf("lookup(%q) = %v, %v; driver %v, %v\nraw %x", key, v, ok, dv, err, raw)
		}
	}
	keys := []string{"_id", "ns", "fullDocument", "lsid", "txnNumber", "other", ""}
	for i, key := range keys {
		v, ok := lookup(raw, key)
		same(v, ok, key)
		key2 := keys[(i+1)%len(keys)]
		v1, ok1, v2, ok2 := lookup2(raw, key, key2)
		same(v1, ok1, key)
		same(v2, ok2, key2)
	}
}

// TestNonPlainMask checks that the lowest byte nonPlainMask flags is the
// first byte that is not jsonPlain (and none when all are), for every byte
// value at every position over random neighbours.
func TestNonPlainMask(t *testing.T) {
	r := rand.New(rand.NewPCG(8, uint64(time.Now().UnixNano())))
	var b [8]byte
	check := func() {
		want := 8
		for i, c := range b {
			if !jsonPlain[c] {
				want = i
				break
			}
		}
		if got := bits.TrailingZeros64(nonPlainMask(binary.LittleEndian.Uint64(b[:]))) >> 3; got != want {
			t.Fatalf("nonPlainMask(%q): first flag at %d, want %d", b[:], got, want)
		}
	}
	for range 2000 {
		for i := range b {
			switch r.IntN(3) {
			case 0:
				b[i] = byte(r.Uint32())
			default:
				b[i] = byte(0x20 + r.IntN(0x60))
			}
		}
		check()
		for pos := range 8 {
			saved := b[pos]
			for c := range 256 {
				b[pos] = byte(c)
				check()
			}
			b[pos] = saved
		}
	}
}
