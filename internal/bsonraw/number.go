package bsonraw

import (
	"encoding/binary"
	"math"
	"math/big"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// IsNumeric reports whether t is one of the numeric types: double, int32,
// int64 or decimal128.
func IsNumeric(t bson.Type) bool {
	return t == bson.TypeDouble || t == bson.TypeInt32 || t == bson.TypeInt64 || t == bson.TypeDecimal128
}

// ReadInt decodes an int32 (when t is bson.TypeInt32) or else an int64
// value.
func ReadInt(t bson.Type, v []byte) int64 {
	if t == bson.TypeInt32 {
		return int64(int32(binary.LittleEndian.Uint32(v)))
	}
	return int64(binary.LittleEndian.Uint64(v))
}

// ReadDouble decodes a double value.
func ReadDouble(v []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(v)) }

// ReadDecimal decodes a decimal128 value.
func ReadDecimal(v []byte) bson.Decimal128 {
	return bson.NewDecimal128(binary.LittleEndian.Uint64(v[8:]), binary.LittleEndian.Uint64(v))
}

// ToFloat converts any numeric value to float64 (lossy for large integers
// and decimals). A value of another type is 0.
func ToFloat(t bson.Type, v []byte) float64 {
	switch t {
	case bson.TypeDouble:
		return ReadDouble(v)
	case bson.TypeInt32, bson.TypeInt64:
		return float64(ReadInt(t, v))
	case bson.TypeDecimal128:
		f, _ := DecimalRat(ReadDecimal(v))
		return f
	}
	return 0
}

// DecimalRat returns a decimal128 as the nearest float64 and as an exact
// rational; the rational is nil for NaN and the infinities (the float is
// then NaN or ±Inf). It allocates.
func DecimalRat(d bson.Decimal128) (float64, *big.Rat) {
	if d.IsNaN() {
		return math.NaN(), nil
	}
	if inf := d.IsInf(); inf != 0 {
		return math.Inf(inf), nil
	}
	bi, exp, err := d.BigInt()
	if err != nil {
		return 0, new(big.Rat)
	}
	r := new(big.Rat).SetInt(bi)
	if exp != 0 {
		p := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(absInt(exp))), nil)
		if exp > 0 {
			r.Mul(r, new(big.Rat).SetInt(p))
		} else {
			r.Quo(r, new(big.Rat).SetInt(p))
		}
	}
	f, _ := r.Float64()
	return f, r
}

func absInt(i int) int {
	if i < 0 {
		return -i
	}
	return i
}

// TruncInt truncates a finite number towards zero into an int64, saturating
// at its bounds. ok is false for NaN, the infinities and non-numeric types.
func TruncInt(t bson.Type, v []byte) (n int64, ok bool) {
	switch t {
	case bson.TypeInt32, bson.TypeInt64:
		return ReadInt(t, v), true
	case bson.TypeDouble, bson.TypeDecimal128:
		f := ToFloat(t, v)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, false
		}
		f = math.Trunc(f)
		if f >= 9.223372036854775807e18 {
			return math.MaxInt64, true
		}
		if f <= -9.223372036854775808e18 {
			return math.MinInt64, true
		}
		return int64(f), true
	}
	return 0, false
}

// Truthy is MongoDB's BSONElement::trueValue: false, null, undefined and
// numeric zero are false, everything else (NaN included) is true.
func Truthy(t bson.Type, v []byte) bool {
	switch t {
	case bson.TypeBoolean:
		return v[0] != 0
	case bson.TypeNull, bson.TypeUndefined:
		return false
	case bson.TypeInt32, bson.TypeInt64, bson.TypeDouble, bson.TypeDecimal128:
		f := ToFloat(t, v)
		return f != 0 || f != f
	}
	return true
}
