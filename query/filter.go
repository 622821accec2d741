package query

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/internal/bsonraw"
)

// Filter is a compiled MongoDB query filter. It is immutable and safe for
// concurrent use by multiple goroutines.
type Filter struct {
	root matcher
}

// Compile validates a MongoDB query filter and compiles it into a [Filter].
// A nil or empty filter matches every document.
//
// Supported: implicit equality (including embedded documents, arrays and
// regular expressions), $eq $ne $gt $gte $lt $lte $in $nin $exists $type
// $and $or $nor $not $regex/$options $size $all $elemMatch $mod, plus
// $comment, $alwaysTrue and $alwaysFalse at the top level. Anything else
// ($expr, $where, $text, geo and bitwise operators, $jsonSchema) is an
// error. Errors are lowercase and name the operator and the field path,
// for example "unknown operator $foo at fullDocument.total".
func Compile(filter bson.Raw) (*Filter, error) {
	if len(filter) == 0 {
		return &Filter{root: constMatcher(true)}, nil
	}
	if err := filter.Validate(); err != nil {
		return nil, fmt.Errorf("invalid filter document: %w", err)
	}
	m, err := parseDoc(filter)
	if err != nil {
		return nil, err
	}
	return &Filter{root: m}, nil
}

// MustCompile is like [Compile] but panics on error. It is meant for
// filters that are constants in code and tests.
func MustCompile(filter bson.Raw) *Filter {
	f, err := Compile(filter)
	if err != nil {
		panic("query: " + err.Error())
	}
	return f
}

// Match reports whether doc satisfies the filter. It does not allocate
// (except for $in over decimals and comparisons of decimal128 values),
// never modifies doc, and treats a malformed document as ending at the
// first malformed element.
func (f *Filter) Match(doc bson.Raw) bool {
	return f.root.matches(doc)
}

type matcher interface {
	matches(doc []byte) bool
}

type constMatcher bool

func (c constMatcher) matches([]byte) bool { return bool(c) }

type andMatcher []matcher

func (a andMatcher) matches(doc []byte) bool {
	for _, m := range a {
		if !m.matches(doc) {
			return false
		}
	}
	return true
}

type orMatcher []matcher

func (o orMatcher) matches(doc []byte) bool {
	for _, m := range o {
		if m.matches(doc) {
			return true
		}
	}
	return false
}

type norMatcher []matcher

func (o norMatcher) matches(doc []byte) bool {
	for _, m := range o {
		if m.matches(doc) {
			return false
		}
	}
	return true
}

type notMatcher struct{ m matcher }

func (n notMatcher) matches(doc []byte) bool { return !n.m.matches(doc) }

// pred is a predicate on the values a path resolves to.
type pred interface {
	// value reports whether a single present value satisfies the predicate.
	value(t bson.Type, v []byte) bool
	// missing reports whether an absent value satisfies the predicate.
	missing() bool
	// expand reports whether the elements of an array reached at the end
	// of the path are candidates too (besides the array itself).
	expand() bool
}

// pathMatcher matches when any value the path resolves to satisfies p.
type pathMatcher struct {
	path []bsonraw.PathPart
	p    pred
}

func (m *pathMatcher) matches(doc []byte) bool { return evalDoc(doc, m.path, m.p) }

func evalDoc(doc []byte, parts []bsonraw.PathPart, p pred) bool {
	t, v, ok := bsonraw.Lookup(doc, parts[0].Name)
	if !ok {
		return p.missing()
	}
	return evalValue(t, v, parts[1:], p)
}

// evalValue implements MongoDB's path traversal: an array met before the
// end of the path is traversed element by element (documents are descended
// into, a numeric component also indexes the array, and, as in MongoDB 8.0
// after SERVER-36681, scalar elements and empty arrays count as a missing
// value); an array at the end of the path matches if any element or the
// array as a whole matches.
func evalValue(t bson.Type, v []byte, rest []bsonraw.PathPart, p pred) bool {
	if len(rest) == 0 {
		if t == bson.TypeArray && p.expand() {
			it := bsonraw.NewIter(v)
			for {
				_, et, ev, ok := it.Next()
				if !ok {
					break
				}
				if p.value(et, ev) {
					return true
				}
			}
		}
		return p.value(t, v)
	}
	switch t {
	case bson.TypeEmbeddedDocument:
		return evalDoc(v, rest, p)
	case bson.TypeArray:
		part := rest[0]
		it := bsonraw.NewIter(v)
		produced := false
		for i := 0; ; i++ {
			_, et, ev, ok := it.Next()
			if !ok {
				break
			}
			if i == part.Index {
				produced = true
				if evalValue(et, ev, rest[1:], p) {
					return true
				}
			}
			if et == bson.TypeEmbeddedDocument {
				produced = true
				if evalDoc(ev, rest, p) {
					return true
				}
			} else if part.Index < 0 {
				produced = true
				if p.missing() {
					return true
				}
			}
		}
		if !produced {
			return p.missing()
		}
		return false
	default:
		return p.missing()
	}
}
