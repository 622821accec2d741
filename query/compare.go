package query

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"math"
	"math/big"

	"github.com/changegate/changegate/internal/bsonraw"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// typeRank returns MongoDB's canonical sort rank of a BSON type
// (canonicalizeBSONType in the server). A zero Type stands for a missing
// value, which sorts and compares as null.
func typeRank(t bson.Type) int {
	if t == 0 {
		return 5 // missing compares as null
	}
	r, ok := bsonraw.CanonicalType(t)
	if !ok {
		return 200
	}
	return int(r)
}

// Compare orders two BSON values the way MongoDB sorts and compares them,
// returning -1, 0 or +1.
//
// Values of different types are ordered by type bracket: MinKey < Undefined
// < Null (a zero RawValue, meaning a missing field, counts as Null) <
// numbers < Symbol and String < Object < Array < BinData < ObjectId <
// Boolean < Date < Timestamp < Regex < DBPointer < JavaScript <
// JavaScript with scope < MaxKey.
//
// Within a bracket: int32, int64, double and decimal128 compare by exact
// numeric value (NaN equals NaN and is less than every other number);
// strings compare by bytes (MongoDB's simple binary collation); documents
// compare element by element (type bracket, then field name, then value),
// a prefix being less; arrays compare element by element the same way;
// BinData by length, then subtype, then bytes; Timestamps as unsigned
// (seconds, increment); Regexes by pattern then options.
func Compare(a, b bson.RawValue) int {
	return compareValues(a.Type, a.Value, b.Type, b.Value)
}

// Equal reports whether two BSON values are equal under [Compare]: numbers
// of different types are equal when their values are (int32(1) equals
// double 1.0), documents must have the same fields in the same order.
func Equal(a, b bson.RawValue) bool {
	return compareValues(a.Type, a.Value, b.Type, b.Value) == 0
}

func compareValues(at bson.Type, av []byte, bt bson.Type, bv []byte) int {
	ra, rb := typeRank(at), typeRank(bt)
	if ra != rb {
		return cmp.Compare(ra, rb)
	}
	switch ra {
	case -1, 0, 5, 127:
		return 0
	case 10:
		return compareNumbers(at, av, bt, bv)
	case 15, 60:
		return bytes.Compare(bsonraw.Str(av), bsonraw.Str(bv))
	case 20, 25:
		return compareDocs(av, bv)
	case 30:
		if len(av) < 5 || len(bv) < 5 {
			return cmp.Compare(len(av), len(bv))
		}
		if c := cmp.Compare(len(av), len(bv)); c != 0 {
			return c
		}
		if c := cmp.Compare(av[4], bv[4]); c != 0 {
			return c
		}
		return bytes.Compare(av[5:], bv[5:])
	case 35:
		return bytes.Compare(av, bv)
	case 40:
		return cmp.Compare(av[0], bv[0])
	case 45:
		return cmp.Compare(int64(binary.LittleEndian.Uint64(av)), int64(binary.LittleEndian.Uint64(bv)))
	case 47:
		return cmp.Compare(binary.LittleEndian.Uint64(av), binary.LittleEndian.Uint64(bv))
	case 50:
		ap, ao := bsonraw.RegexParts(av)
		bp, bo := bsonraw.RegexParts(bv)
		if c := bytes.Compare(ap, bp); c != 0 {
			return c
		}
		return bytes.Compare(ao, bo)
	case 55:
		if c := cmp.Compare(len(av), len(bv)); c != 0 {
			return c
		}
		return bytes.Compare(av, bv)
	case 65:
		// code then scope
		ac, as := cwsParts(av)
		bc, bs := cwsParts(bv)
		if c := bytes.Compare(ac, bc); c != 0 {
			return c
		}
		return compareDocs(as, bs)
	}
	return bytes.Compare(av, bv)
}

func cwsParts(v []byte) (code, scope []byte) {
	if len(v) < 8 {
		return nil, nil
	}
	n := bsonraw.ValueLen(bson.TypeString, v[4:])
	if n < 0 {
		return nil, nil
	}
	return bsonraw.Str(v[4 : 4+n]), v[4+n:]
}

func compareDocs(a, b []byte) int {
	ia, ib := bsonraw.NewIter(a), bsonraw.NewIter(b)
	for {
		ka, ta, va, oka := ia.Next()
		kb, tb, vb, okb := ib.Next()
		if !oka || !okb {
			return cmp.Compare(b2i(oka), b2i(okb))
		}
		if c := cmp.Compare(typeRank(ta), typeRank(tb)); c != 0 {
			return c
		}
		if c := bytes.Compare(ka, kb); c != 0 {
			return c
		}
		if c := compareValues(ta, va, tb, vb); c != 0 {
			return c
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// numIsNaN reports whether a numeric value is NaN.
func numIsNaN(t bson.Type, v []byte) bool {
	switch t {
	case bson.TypeDouble:
		f := bsonraw.ReadDouble(v)
		return f != f
	case bson.TypeDecimal128:
		return bsonraw.ReadDecimal(v).IsNaN()
	}
	return false
}

func compareNumbers(at bson.Type, av []byte, bt bson.Type, bv []byte) int {
	aInt := at == bson.TypeInt32 || at == bson.TypeInt64
	bInt := bt == bson.TypeInt32 || bt == bson.TypeInt64
	switch {
	case aInt && bInt:
		return cmp.Compare(bsonraw.ReadInt(at, av), bsonraw.ReadInt(bt, bv))
	case at == bson.TypeDecimal128 || bt == bson.TypeDecimal128:
		return compareExact(at, av, bt, bv)
	case aInt: // b double
		return compareIntFloat(bsonraw.ReadInt(at, av), bsonraw.ReadDouble(bv))
	case bInt: // a double
		return -compareIntFloat(bsonraw.ReadInt(bt, bv), bsonraw.ReadDouble(av))
	default:
		x, y := bsonraw.ReadDouble(av), bsonraw.ReadDouble(bv)
		xn, yn := x != x, y != y
		if xn || yn {
			return cmp.Compare(b2i(!xn), b2i(!yn))
		}
		return cmp.Compare(x, y)
	}
}

// compareIntFloat compares an integer with a double exactly. NaN is less
// than every integer.
func compareIntFloat(i int64, f float64) int {
	if f != f {
		return 1
	}
	if f >= 9.223372036854775807e18 {
		return -1
	}
	if f < -9.223372036854775808e18 {
		return 1
	}
	t := math.Trunc(f)
	if c := cmp.Compare(i, int64(t)); c != 0 {
		return c
	}
	return cmp.Compare(0, f-t)
}

// numClass splits a number into NaN (0), -Inf (1), finite (2), +Inf (3).
func numExact(t bson.Type, v []byte) (class int, r *big.Rat) {
	switch t {
	case bson.TypeInt32, bson.TypeInt64:
		return 2, new(big.Rat).SetInt64(bsonraw.ReadInt(t, v))
	case bson.TypeDouble:
		f := bsonraw.ReadDouble(v)
		switch {
		case f != f:
			return 0, nil
		case math.IsInf(f, -1):
			return 1, nil
		case math.IsInf(f, 1):
			return 3, nil
		}
		return 2, new(big.Rat).SetFloat64(f)
	case bson.TypeDecimal128:
		d := bsonraw.ReadDecimal(v)
		if d.IsNaN() {
			return 0, nil
		}
		if inf := d.IsInf(); inf != 0 {
			return 2 + inf, nil
		}
		_, r := bsonraw.DecimalRat(d)
		return 2, r
	}
	return 0, nil
}

func compareExact(at bson.Type, av []byte, bt bson.Type, bv []byte) int {
	ca, ra := numExact(at, av)
	cb, rb := numExact(bt, bv)
	if ca != cb || ca != 2 {
		return cmp.Compare(ca, cb)
	}
	return ra.Cmp(rb)
}
