package query

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/internal/bsonraw"
)

// This file holds the predicates of a filter (pred): the test of one value
// at a path, what an absent value means, and whether the elements of an
// array at the end of the path are candidates too.

type eqPred struct {
	t bson.Type
	v []byte
}

func (e *eqPred) value(t bson.Type, v []byte) bool {
	return typeRank(t) == typeRank(e.t) && compareValues(t, v, e.t, e.v) == 0
}
func (e *eqPred) missing() bool { return e.t == bson.TypeNull }
func (e *eqPred) expand() bool  { return true }

type cmpOp int

const (
	opLT cmpOp = iota
	opLTE
	opGT
	opGTE
)

type cmpPred struct {
	op      cmpOp
	t       bson.Type
	v       []byte
	anyType bool // operand is MinKey or MaxKey: compare across types
	nan     bool
}

func (c *cmpPred) value(t bson.Type, v []byte) bool {
	if !c.anyType && typeRank(t) != typeRank(c.t) {
		return false
	}
	if bsonraw.IsNumeric(t) && bsonraw.IsNumeric(c.t) && (c.nan || numIsNaN(t, v)) {
		// NaN only compares equal to NaN; ordering comparisons with NaN
		// are false.
		return c.nan && numIsNaN(t, v) && (c.op == opLTE || c.op == opGTE)
	}
	return c.test(compareValues(t, v, c.t, c.v))
}

func (c *cmpPred) test(r int) bool {
	switch c.op {
	case opLT:
		return r < 0
	case opLTE:
		return r <= 0
	case opGT:
		return r > 0
	}
	return r >= 0
}

func (c *cmpPred) missing() bool {
	if c.t == bson.TypeNull || c.anyType {
		return c.test(compareValues(bson.TypeNull, nil, c.t, c.v))
	}
	return false
}
func (c *cmpPred) expand() bool { return true }

type inPred struct {
	strs    map[string]struct{}
	others  []bson.RawValue
	regexes []*regexPred
	hasNull bool
}

func (in *inPred) value(t bson.Type, v []byte) bool {
	if t == bson.TypeString || t == bson.TypeSymbol {
		if _, ok := in.strs[string(bsonraw.Str(v))]; ok {
			return true
		}
	} else {
		r := typeRank(t)
		for _, o := range in.others {
			if typeRank(o.Type) == r && compareValues(t, v, o.Type, o.Value) == 0 {
				return true
			}
		}
	}
	for _, re := range in.regexes {
		if re.value(t, v) {
			return true
		}
	}
	return false
}
func (in *inPred) missing() bool { return in.hasNull }
func (in *inPred) expand() bool  { return true }

type existsPred struct{}

func (existsPred) value(bson.Type, []byte) bool { return true }
func (existsPred) missing() bool                { return false }
func (existsPred) expand() bool                 { return false }

type typePred struct {
	types  [256]bool
	number bool
}

func (tp *typePred) value(t bson.Type, _ []byte) bool {
	return tp.types[byte(t)] || (tp.number && bsonraw.IsNumeric(t))
}
func (tp *typePred) missing() bool { return false }
func (tp *typePred) expand() bool  { return true }

type sizePred struct{ n int }

func (s sizePred) value(t bson.Type, v []byte) bool {
	return t == bson.TypeArray && bsonraw.CountElems(v) == s.n
}
func (sizePred) missing() bool { return false }
func (sizePred) expand() bool  { return false }

type modPred struct{ d, r int64 }

func (m modPred) value(t bson.Type, v []byte) bool {
	x, ok := bsonraw.TruncInt(t, v)
	return ok && x%m.d == m.r
}
func (modPred) missing() bool { return false }
func (modPred) expand() bool  { return true }

type elemMatchObjPred struct{ m matcher }

func (e *elemMatchObjPred) value(t bson.Type, v []byte) bool {
	return anyElement(t, v, func(et bson.Type, ev []byte) bool {
		return (et == bson.TypeEmbeddedDocument || et == bson.TypeArray) && e.m.matches(ev)
	})
}
func (*elemMatchObjPred) missing() bool { return false }
func (*elemMatchObjPred) expand() bool  { return false }

type elemMatchValPred struct{ p pred }

func (e *elemMatchValPred) value(t bson.Type, v []byte) bool {
	return anyElement(t, v, e.p.value)
}
func (*elemMatchValPred) missing() bool { return false }
func (*elemMatchValPred) expand() bool  { return false }

// anyElement reports whether v is an array (t) with an element for which
// match holds ($elemMatch's test).
func anyElement(t bson.Type, v []byte, match func(bson.Type, []byte) bool) bool {
	if t != bson.TypeArray {
		return false
	}
	it := bsonraw.NewIter(v)
	for {
		_, et, ev, ok := it.Next()
		if !ok {
			return false
		}
		if match(et, ev) {
			return true
		}
	}
}

type andPred []pred

func (a andPred) value(t bson.Type, v []byte) bool {
	for _, p := range a {
		if !p.value(t, v) {
			return false
		}
	}
	return true
}
func (a andPred) missing() bool {
	for _, p := range a {
		if !p.missing() {
			return false
		}
	}
	return true
}
func (andPred) expand() bool { return false }

type notPred struct{ p pred }

func (n notPred) value(t bson.Type, v []byte) bool { return !n.p.value(t, v) }
func (n notPred) missing() bool                    { return !n.p.missing() }
func (notPred) expand() bool                       { return false }

type constPred bool

func (c constPred) value(bson.Type, []byte) bool { return bool(c) }
func (c constPred) missing() bool                { return bool(c) }
func (constPred) expand() bool                   { return false }
