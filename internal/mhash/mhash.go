// Package mhash computes the hash of a MongoDB hashed index, the value of
// the $toHashedIndexKey expression, and the partition of a value among N.
// The gateway uses it to filter partitions of a source client-side where
// the server lacks $toHashedIndexKey; test/mongowire uses it to answer the
// expression. Both must agree with the server, so there is one copy.
//
// Read in mongodb/mongo:
//   - src/mongo/db/hasher.cpp: BSONElementHasher::hash64 runs MD5 over the
//     seed (int32, little-endian), then recursiveHash(element,
//     includeFieldName=false); the result is the first 8 digest bytes read
//     as a little-endian int64. recursiveHash adds the element's canonical
//     type (int32 LE), the field name with its NUL when includeFieldName,
//     then: for a number, safeNumberLongForHash() as int64 LE; for any other
//     type that cannot encapsulate, the value bytes exactly as BSON stores
//     them (valuesize()); for an object, array or code-with-scope, (the
//     code string for code-with-scope, then) every sub-element with its
//     field name, and finally the terminating EOO element (canonical type
//     0, no name: fieldNameSize is 0 for EOO in bsonelement.h, no value).
//   - src/mongo/bson/bsontypes.h canonicalizeBSONType: MinKey -1, EOO and
//     undefined 0, null 5, all numbers 10, string and symbol 15, object 20,
//     array 25, binData 30, ObjectId 35, bool 40, date 45, timestamp 47,
//     regex 50, DBPointer 55, code 60, code-with-scope 65, MaxKey 127.
//   - src/mongo/bson/bsonelement.h safeNumberLong / safeNumberLongForHash:
//     NaN -> 0, doubles >= 2^63 -> MaxInt64 except exactly 2^63 -> MinInt64
//     (kept for compatibility), doubles < -2^63 -> MinInt64, others
//     truncated toward zero; decimals clamp to the int64 range and convert
//     with Decimal128::toLong's default rounding (ties to even).
//   - src/mongo/db/pipeline/expression.h ExpressionToHashedIndexKey: a
//     missing input is hashed as null, and the value is hashed as the
//     element BSON("" << input).firstElement() with the default seed 0.
//
// Test vectors: the server's own startup check (hasher.cpp) is
// hash64({check: 42}.firstElement(), 0) == -944302157085130861, and the
// documented example is {$toHashedIndexKey: "string to hash"} ->
// 763543691661428748.
package mhash

import (
	"crypto/md5"
	"encoding/binary"
	"math"
	"math/big"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/internal/bsonraw"
)

// canonicalType is canonicalizeBSONType of t (math.MinInt8 for a type
// the server does not know).
func canonicalType(t bson.Type) int32 {
	r, ok := bsonraw.CanonicalType(t)
	if !ok {
		return math.MinInt8
	}
	return r
}

// HashedIndexKey returns BSONElementHasher::hash64 of v with seed 0, the
// value of {$toHashedIndexKey: v}. A missing value (Type 0) hashes as null.
func HashedIndexKey(v bson.RawValue) int64 {
	if v.Type == 0 {
		v = bson.RawValue{Type: bson.TypeNull}
	}
	h := md5.New()
	var seed [4]byte // HashSeed 0
	h.Write(seed[:])
	hashElement(h, "", v, false)
	sum := h.Sum(nil)
	return int64(binary.LittleEndian.Uint64(sum[:8]))
}

type byteWriter interface{ Write([]byte) (int, error) }

func hashElement(h byteWriter, name string, v bson.RawValue, includeName bool) {
	var b [8]byte
	binary.LittleEndian.PutUint32(b[:4], uint32(canonicalType(v.Type)))
	h.Write(b[:4])
	if includeName {
		h.Write([]byte(name))
		h.Write([]byte{0})
	}
	switch v.Type {
	case bson.TypeDouble, bson.TypeInt32, bson.TypeInt64, bson.TypeDecimal128:
		binary.LittleEndian.PutUint64(b[:], uint64(safeNumberLongForHash(v)))
		h.Write(b[:])
	case bson.TypeEmbeddedDocument, bson.TypeArray, bson.TypeCodeWithScope:
		doc := bson.Raw(v.Value)
		if v.Type == bson.TypeCodeWithScope {
			// value: int32 total, string code (int32 len, bytes, NUL), scope doc;
			// codeWScopeCode()/codeWScopeCodeLen() are the code bytes with NUL.
			n := int(binary.LittleEndian.Uint32(v.Value[4:8]))
			h.Write(v.Value[8 : 8+n])
			doc = bson.Raw(v.Value[8+n:])
		}
		elems, _ := doc.Elements()
		for _, e := range elems {
			hashElement(h, e.Key(), e.Value(), true)
		}
		binary.LittleEndian.PutUint32(b[:4], 0) // EOO: type 0, no name, no value
		h.Write(b[:4])
	default:
		h.Write(v.Value)
	}
}

// safeNumberLongForHash is BSONElement::safeNumberLongForHash.
func safeNumberLongForHash(v bson.RawValue) int64 {
	const twoTo63 = float64(1 << 63)
	switch v.Type {
	case bson.TypeInt32:
		return int64(v.Int32())
	case bson.TypeInt64:
		return v.Int64()
	case bson.TypeDouble:
		d := v.Double()
		switch {
		case math.IsNaN(d):
			return 0
		case d == twoTo63:
			return math.MinInt64
		case !(d < twoTo63):
			return math.MaxInt64
		case d < -twoTo63:
			return math.MinInt64
		}
		return int64(d)
	case bson.TypeDecimal128:
		return decimalToLongForHash(v.Decimal128())
	}
	return 0
}

// decimalToLongForHash clamps d to the int64 range (NaN: 0) and rounds it
// half to even, as Decimal128::toLong does by default.
func decimalToLongForHash(d bson.Decimal128) int64 {
	s := d.String()
	switch s {
	case "NaN", "-NaN":
		return 0
	case "Infinity":
		return math.MaxInt64
	case "-Infinity":
		return math.MinInt64
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return 0
	}
	if r.Cmp(new(big.Rat).SetInt64(math.MaxInt64)) > 0 {
		return math.MaxInt64
	}
	if r.Cmp(new(big.Rat).SetInt64(math.MinInt64)) < 0 {
		return math.MinInt64
	}
	// Round half to even.
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	twice := new(big.Int).Mul(new(big.Int).Abs(m), big.NewInt(2))
	c := twice.Cmp(r.Denom())
	if c > 0 || c == 0 && q.Bit(0) == 1 {
		if r.Sign() < 0 {
			q.Sub(q, big.NewInt(1))
		} else {
			q.Add(q, big.NewInt(1))
		}
	}
	return q.Int64()
}

// Partition returns the partition, in [0, n), of a value whose hashed index
// key is h: ((h mod n) + n) mod n, so that negative hashes map as well. It
// is the Go form of the partition filter's
// {$mod: [{$add: [{$mod: [h, n]}, n]}, n]}. n must be positive.
func Partition(h int64, n int) int {
	m := int64(n)
	return int(((h % m) + m) % m)
}
