package query

import (
	"math"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/internal/bsonraw"
)

// This file lets a router index many filters by a field they compare for
// equality, so that routing a change among many filters evaluates only the
// few whose value matches.

// Equality is a condition every document a filter matches satisfies: the
// value at Path equals Value (a string, ObjectId, boolean or number other
// than decimal128 and NaN: the types a ValueIndex holds).
type Equality struct {
	Path  string
	Value bson.RawValue
}

// Equalities returns the equality conditions of f's top-level conjunction
// (implicit equality or $eq, in nested $and too) whose value a ValueIndex
// can hold. A document f matches satisfies each of them; f may demand
// more.
func (f *Filter) Equalities() []Equality {
	var out []Equality
	collectEqualities(f.root, &out)
	return out
}

func collectEqualities(m matcher, out *[]Equality) {
	switch t := m.(type) {
	case andMatcher:
		for _, c := range t {
			collectEqualities(c, out)
		}
	case *pathMatcher:
		eq, ok := t.p.(*eqPred)
		if !ok || !indexable(eq.t, eq.v) {
			return
		}
		path := t.path[0].Name
		for _, p := range t.path[1:] {
			path += "." + p.Name
		}
		*out = append(*out, Equality{Path: path, Value: bson.RawValue{Type: eq.t, Value: eq.v}})
	}
}

// indexable reports whether a ValueIndex holds values of type t.
func indexable(t bson.Type, v []byte) bool {
	switch t {
	case bson.TypeString, bson.TypeSymbol, bson.TypeObjectID, bson.TypeBoolean, bson.TypeInt32, bson.TypeInt64:
		return true
	case bson.TypeDouble:
		return !math.IsNaN(bsonraw.ReadDouble(v))
	}
	return false
}

// numKey is a number as a ValueIndex key: integral values (of any type)
// by their int64 value, others by their float64 bits, so that keys are
// equal exactly when the numbers compare equal.
type numKey struct {
	float bool
	bits  uint64
}

func numberKey(t bson.Type, v []byte) (numKey, bool) {
	switch t {
	case bson.TypeInt32, bson.TypeInt64:
		return numKey{bits: uint64(bsonraw.ReadInt(t, v))}, true
	case bson.TypeDouble:
		d := bsonraw.ReadDouble(v)
		if math.IsNaN(d) {
			return numKey{}, false
		}
		if d == math.Trunc(d) && d >= -(1<<63) && d < 1<<63 {
			return numKey{bits: uint64(int64(d))}, true
		}
		return numKey{float: true, bits: math.Float64bits(d)}, true
	}
	return numKey{}, false
}

// ValueIndex maps values to ids under the equality of filters (Equal): a
// string equals a symbol of the same bytes, int32(1) equals 1.0. Build it
// with Add, then Lookup is safe for concurrent use.
type ValueIndex struct {
	str  map[string][]int
	oid  map[bson.ObjectID][]int
	num  map[numKey][]int
	bool [2][]int
}

// Add files id under v; false when v's type is not held (see Equality).
func (x *ValueIndex) Add(v bson.RawValue, id int) bool {
	if !indexable(v.Type, v.Value) {
		return false
	}
	switch v.Type {
	case bson.TypeString, bson.TypeSymbol:
		if x.str == nil {
			x.str = map[string][]int{}
		}
		k := string(bsonraw.Str(v.Value))
		x.str[k] = append(x.str[k], id)
	case bson.TypeObjectID:
		if x.oid == nil {
			x.oid = map[bson.ObjectID][]int{}
		}
		k := bson.ObjectID(v.Value[:12])
		x.oid[k] = append(x.oid[k], id)
	case bson.TypeBoolean:
		b := 0
		if v.Value[0] != 0 {
			b = 1
		}
		x.bool[b] = append(x.bool[b], id)
	default:
		k, _ := numberKey(v.Type, v.Value)
		if x.num == nil {
			x.num = map[numKey][]int{}
		}
		x.num[k] = append(x.num[k], id)
	}
	return true
}

// Lookup returns the ids filed under a value equal to (t, v), and true;
// false when the index cannot tell (a decimal128 or NaN value: the caller
// must consider every id). The slice is the index's: read-only.
func (x *ValueIndex) Lookup(t bson.Type, v []byte) ([]int, bool) {
	switch t {
	case bson.TypeString, bson.TypeSymbol:
		return x.str[string(bsonraw.Str(v))], true
	case bson.TypeObjectID:
		if len(v) < 12 {
			return nil, true
		}
		return x.oid[bson.ObjectID(v[:12])], true
	case bson.TypeBoolean:
		if len(v) < 1 {
			return nil, true
		}
		if v[0] != 0 {
			return x.bool[1], true
		}
		return x.bool[0], true
	case bson.TypeInt32, bson.TypeInt64, bson.TypeDouble:
		k, ok := numberKey(t, v)
		if !ok {
			return nil, false
		}
		return x.num[k], true
	case bson.TypeDecimal128:
		return nil, false
	}
	// Another type never equals an indexed value.
	return nil, true
}

// Path is a compiled dotted field path for ScalarAt.
type Path struct{ parts []bsonraw.PathPart }

// CompilePath compiles a dotted field path.
func CompilePath(path string) Path { return Path{bsonraw.SplitPath(path)} }

// ScalarAt returns the value at path in doc when the path reaches one
// value that is not an array through embedded documents only (found and
// simple true); found false and simple true when the path reaches no value
// (then no equality with a held value holds); simple false when an array
// is met (every value of it would count): the caller must evaluate the
// filters themselves.
func ScalarAt(doc bson.Raw, path Path) (t bson.Type, v []byte, found, simple bool) {
	cur := []byte(doc)
	for i, p := range path.parts {
		t, v, ok := bsonraw.Lookup(cur, p.Name)
		if !ok {
			return 0, nil, false, true
		}
		if t == bson.TypeArray {
			return 0, nil, false, false
		}
		if i == len(path.parts)-1 {
			return t, v, true, true
		}
		if t != bson.TypeEmbeddedDocument {
			return 0, nil, false, true
		}
		cur = v
	}
	return 0, nil, false, true
}
