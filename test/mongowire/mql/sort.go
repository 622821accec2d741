package mql

import (
	"fmt"
	"strings"

	"github.com/changegate/changegate/internal/bsonraw"
	"github.com/changegate/changegate/query"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Sort is a compiled sort specification. It is immutable and safe for
// concurrent use.
type Sort struct {
	keys []sortKey
}

type sortKey struct {
	path []bsonraw.PathPart
	desc bool
}

// CompileSort validates and compiles a sort specification such as
// {"status": 1, "qty": -1}. Each value must be a number equal to 1 or -1;
// {$meta: ...} sorts are not supported. An empty specification compiles to
// a Sort under which all documents compare equal.
func CompileSort(spec bson.Raw) (*Sort, error) {
	s := &Sort{}
	if len(spec) == 0 {
		return s, nil
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("invalid sort document: %w", err)
	}
	it := bsonraw.NewIter(spec)
	for {
		k, t, v, ok := it.Next()
		if !ok {
			break
		}
		key := string(k)
		if key == "" || strings.HasPrefix(key, "$") || strings.Contains(key, "..") || strings.HasPrefix(key, ".") || strings.HasSuffix(key, ".") {
			return nil, fmt.Errorf("invalid sort key %q", key)
		}
		if t == bson.TypeEmbeddedDocument {
			return nil, fmt.Errorf("sort by $meta or expressions is not supported at %s", key)
		}
		if !bsonraw.IsNumeric(t) {
			return nil, fmt.Errorf("sort key ordering must be 1 (for ascending) or -1 (for descending) at %s", key)
		}
		switch bsonraw.ToFloat(t, v) {
		case 1:
			s.keys = append(s.keys, sortKey{path: bsonraw.SplitPath(key)})
		case -1:
			s.keys = append(s.keys, sortKey{path: bsonraw.SplitPath(key), desc: true})
		default:
			return nil, fmt.Errorf("sort key ordering must be 1 (for ascending) or -1 (for descending) at %s", key)
		}
	}
	return s, nil
}

// Compare orders two documents under the sort specification, returning -1
// when a sorts before b, +1 when after and 0 when the specification does
// not distinguish them (callers wanting MongoDB's behaviour for ties keep
// the natural order, e.g. with a stable sort).
//
// A missing field sorts as null. When a path reaches arrays, the sort key
// is the smallest element for an ascending key and the largest for a
// descending one (per [query.Compare]); an empty array sorts before null.
func (s *Sort) Compare(a, b bson.Raw) int {
	for i := range s.keys {
		k := &s.keys[i]
		at, av := k.value(a)
		bt, bv := k.value(b)
		c := query.Compare(bsonraw.Value(at, av), bsonraw.Value(bt, bv))
		if k.desc {
			c = -c
		}
		if c != 0 {
			return c
		}
	}
	return 0
}

// keyAcc accumulates the extreme candidate value of a sort key.
type keyAcc struct {
	desc  bool
	found bool
	t     bson.Type
	v     []byte
}

func (a *keyAcc) add(t bson.Type, v []byte) {
	if !a.found {
		a.found, a.t, a.v = true, t, v
		return
	}
	c := query.Compare(bsonraw.Value(t, v), bsonraw.Value(a.t, a.v))
	if (a.desc && c > 0) || (!a.desc && c < 0) {
		a.t, a.v = t, v
	}
}

func (k *sortKey) value(doc []byte) (bson.Type, []byte) {
	acc := keyAcc{desc: k.desc}
	sortCollectDoc(doc, k.path, &acc)
	if !acc.found {
		return bson.TypeNull, nil
	}
	return acc.t, acc.v
}

func sortCollectDoc(doc []byte, parts []bsonraw.PathPart, acc *keyAcc) {
	t, v, ok := bsonraw.Lookup(doc, parts[0].Name)
	if !ok {
		acc.add(bson.TypeNull, nil)
		return
	}
	sortCollect(t, v, parts[1:], acc)
}

func sortCollect(t bson.Type, v []byte, rest []bsonraw.PathPart, acc *keyAcc) {
	if len(rest) == 0 {
		if t != bson.TypeArray {
			acc.add(t, v)
			return
		}
		it := bsonraw.NewIter(v)
		n := 0
		for {
			_, et, ev, ok := it.Next()
			if !ok {
				break
			}
			n++
			acc.add(et, ev)
		}
		if n == 0 {
			acc.add(bson.TypeUndefined, nil)
		}
		return
	}
	switch t {
	case bson.TypeEmbeddedDocument:
		sortCollectDoc(v, rest, acc)
	case bson.TypeArray:
		it := bsonraw.NewIter(v)
		produced := false
		for i := 0; ; i++ {
			_, et, ev, ok := it.Next()
			if !ok {
				break
			}
			switch {
			case i == rest[0].Index:
				produced = true
				sortCollect(et, ev, rest[1:], acc)
			case et == bson.TypeEmbeddedDocument:
				produced = true
				sortCollectDoc(ev, rest, acc)
			}
		}
		if !produced {
			acc.add(bson.TypeNull, nil)
		}
	default:
		acc.add(bson.TypeNull, nil)
	}
}
