package mql

import (
	"slices"
	"strings"

	"github.com/changegate/changegate/internal/bsonraw"
	"github.com/changegate/changegate/query"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// UpsertSeed returns the fields an upsert copies from its query filter into
// the document it inserts, before applying the update with
// UpdateOptions.Insert set (MongoDB's "equality clauses in the query").
//
// Seeded are top-level fields compared by equality ({a: 1}, {a: {$eq: 1}},
// {a: {$in: [1]}} with exactly one element, embedded documents and arrays
// as literals), also inside $and and a single-clause $or. Regex equality,
// other operators and $nor/multi-clause $or contribute nothing. Dotted
// paths become nested documents ({"a.b": 1} seeds {a: {b: 1}}). The
// filter is compiled first, so an invalid filter is an error; two clauses
// on the same or overlapping paths are an *[Error] with code 54
// NotSingleValueField, as in MongoDB. Values are bson.RawValue and nested
// documents bson.D, in filter order.
func UpsertSeed(filter bson.Raw) (bson.D, error) {
	if _, err := query.Compile(filter); err != nil {
		return nil, errf(codeBadValue, "BadValue", "%v", err)
	}
	var eqs []seedField
	collectSeed(filter, &eqs)
	root := newDoc()
	var seen [][]string
	for _, e := range eqs {
		for _, s := range seen {
			if slices.Equal(s, e.parts) {
				return nil, errf(54, "NotSingleValueField", "cannot infer query fields to set, path '%s' is matched twice", e.path)
			}
			if isPrefix(s, e.parts) || isPrefix(e.parts, s) {
				a, b := strings.Join(s, "."), e.path
				if len(b) < len(a) {
					a, b = b, a
				}
				return nil, errf(54, "NotSingleValueField", "cannot infer query fields to set, both paths '%s' and '%s' are matched", a, b)
			}
		}
		seen = append(seen, e.parts)
		cur := root
		for _, p := range e.parts[:len(e.parts)-1] {
			next, _ := cur.field(p)
			if next == nil {
				next = newDoc()
				cur.fields = append(cur.fields, mfield{key: p, v: next})
			}
			cur = next
		}
		cur.fields = append(cur.fields, mfield{key: e.parts[len(e.parts)-1], v: decodeValue(e.val.Type, e.val.Value)})
	}
	return toD(root), nil
}

type seedField struct {
	path  string
	parts []string
	val   bson.RawValue
}

func collectSeed(filter []byte, out *[]seedField) {
	it := bsonraw.NewIter(filter)
	for {
		k, t, v, ok := it.Next()
		if !ok {
			return
		}
		key := string(k)
		switch {
		case key == "$and" || key == "$or":
			if key == "$or" && bsonraw.CountElems(v) != 1 {
				continue
			}
			ait := bsonraw.NewIter(v)
			for {
				_, et, ev, ok := ait.Next()
				if !ok {
					break
				}
				if et == bson.TypeEmbeddedDocument {
					collectSeed(ev, out)
				}
			}
		case strings.HasPrefix(key, "$"):
		case t == bson.TypeRegex:
		case t == bson.TypeEmbeddedDocument && bsonraw.IsOperatorDoc(v):
			oit := bsonraw.NewIter(v)
			for {
				ok2, ot, ov, ok := oit.Next()
				if !ok {
					break
				}
				switch string(ok2) {
				case "$eq":
					if ot != bson.TypeRegex {
						*out = append(*out, seedField{key, strings.Split(key, "."), bsonraw.Value(ot, ov)})
					}
				case "$in":
					if bsonraw.CountElems(ov) == 1 {
						_, et, ev := bsonraw.FirstElem(ov)
						if et != bson.TypeRegex {
							*out = append(*out, seedField{key, strings.Split(key, "."), bsonraw.Value(et, ev)})
						}
					}
				}
			}
		default:
			*out = append(*out, seedField{key, strings.Split(key, "."), bsonraw.Value(t, v)})
		}
	}
}

// toD converts a mutable document into a bson.D whose leaves are
// bson.RawValue and whose created subdocuments are bson.D.
func toD(m *mval) bson.D {
	d := make(bson.D, 0, len(m.fields))
	for _, f := range m.fields {
		if f.v.t == bson.TypeEmbeddedDocument && f.v.raw == nil {
			d = append(d, bson.E{Key: f.key, Value: toD(f.v)})
			continue
		}
		d = append(d, bson.E{Key: f.key, Value: f.v.rawValue()})
	}
	return d
}
