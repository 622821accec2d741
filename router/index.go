package router

import (
	"maps"
	"slices"
	"strings"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/query"
)

// This file indexes the rules of a source with many rules (subscriptions:
// up to max_subscriptions on one source) so that routing a change costs
// about what it costs among a few rules: the rules are filed by operation
// type and namespace, and within those by the value one of their filter's
// equality conditions demands; a change is matched against the rules its
// operation, namespace and value select only. The selection is a superset
// of the matching rules (rule.matches decides), so routing is unchanged.

// indexMinRules is the number of rules of a source from which they are
// indexed; below it a scan is as cheap.
const indexMinRules = 16

// bucketKey files a rule by one of its operations ("": every operation)
// and one of its namespaces (db "" : every namespace; coll "*": the
// database's).
type bucketKey struct{ op, db, coll string }

// bucket is the rules of one bucketKey: grouped by the path of an
// equality condition, and the rest.
type bucket struct {
	groups []eqGroup
	rest   []int // positions in the source's rules
}

// eqGroup is the rules whose filter demands a value at path, filed by it.
type eqGroup struct {
	path  query.Path
	index query.ValueIndex
	all   []int
}

// sourceIndex is the index of one source's rules.
type sourceIndex struct {
	buckets map[bucketKey]*bucket
	// probes says which kinds of bucket exist (probe* bits), so that
	// routing looks only those up.
	probes uint8
}

const (
	probeOpNs uint8 = 1 << iota // op and db.coll
	probeOpDB                   // op and db.*
	probeOp                     // op, every namespace
	probeNs                     // every op, db.coll
	probeDB                     // every op, db.*
	probeAll                    // every op and namespace
)

func probeOf(k bucketKey) uint8 {
	var p uint8
	switch {
	case k.db == "":
		p = probeAll
	case k.coll == "*":
		p = probeDB
	default:
		p = probeNs
	}
	if k.op != "" {
		p >>= 3
	}
	return p
}

// buildIndex indexes rules (one source's, in config order), or returns
// nil when there are too few.
func buildIndex(rules []*rule) *sourceIndex {
	if len(rules) < indexMinRules {
		return nil
	}
	x := &sourceIndex{buckets: map[bucketKey]*bucket{}}
	members := map[bucketKey][]int{}
	var order []bucketKey
	for pos, r := range rules {
		ops := []string{""}
		if r.ops != nil {
			ops = slices.Sorted(maps.Keys(r.ops))
		}
		var nss []bucketKey
		if r.nsDB == nil {
			nss = []bucketKey{{}}
		} else {
			for db := range r.nsDB {
				nss = append(nss, bucketKey{db: db, coll: "*"})
			}
			for full := range r.nsFull {
				db, coll, _ := strings.Cut(full, ".")
				nss = append(nss, bucketKey{db: db, coll: coll})
			}
		}
		for _, op := range ops {
			for _, ns := range nss {
				k := bucketKey{op: op, db: ns.db, coll: ns.coll}
				if _, ok := members[k]; !ok {
					order = append(order, k)
				}
				members[k] = append(members[k], pos)
			}
		}
	}
	for _, k := range order {
		x.buckets[k] = newBucket(rules, members[k])
		x.probes |= probeOf(k)
	}
	return x
}

// newBucket groups the rules at positions by the equality condition whose
// path most of them share.
func newBucket(rules []*rule, positions []int) *bucket {
	eqs := make([][]query.Equality, len(positions))
	count := map[string]int{}
	for i, pos := range positions {
		if f := rules[pos].filter; f != nil {
			eqs[i] = f.Equalities()
			seen := map[string]bool{}
			for _, eq := range eqs[i] {
				if !seen[eq.Path] {
					seen[eq.Path] = true
					count[eq.Path]++
				}
			}
		}
	}
	b := &bucket{}
	groupOf := map[string]int{}
	for i, pos := range positions {
		best := -1
		for j, eq := range eqs[i] {
			if best < 0 || count[eq.Path] > count[eqs[i][best].Path] {
				best = j
			}
		}
		if best < 0 {
			b.rest = append(b.rest, pos)
			continue
		}
		eq := eqs[i][best]
		g, ok := groupOf[eq.Path]
		if !ok {
			g = len(b.groups)
			groupOf[eq.Path] = g
			b.groups = append(b.groups, eqGroup{path: query.CompilePath(eq.Path)})
		}
		b.groups[g].index.Add(eq.Value, pos)
		b.groups[g].all = append(b.groups[g].all, pos)
	}
	return b
}

// candidates appends to buf the positions of the rules that may match e,
// sorted and without duplicates.
func (x *sourceIndex) candidates(e *event.Event, buf []int) []int {
	p := x.probes
	for _, k := range [...]struct {
		bit uint8
		key bucketKey
	}{
		{probeOpNs, bucketKey{e.OperationType, e.DB, e.Coll}},
		{probeOpDB, bucketKey{e.OperationType, e.DB, "*"}},
		{probeOp, bucketKey{e.OperationType, "", ""}},
		{probeNs, bucketKey{"", e.DB, e.Coll}},
		{probeDB, bucketKey{"", e.DB, "*"}},
		{probeAll, bucketKey{}},
	} {
		if p&k.bit == 0 {
			continue
		}
		if b := x.buckets[k.key]; b != nil {
			buf = b.candidates(e, buf)
		}
	}
	if len(buf) > 1 {
		slices.Sort(buf)
		buf = slices.Compact(buf)
	}
	return buf
}

func (b *bucket) candidates(e *event.Event, buf []int) []int {
	buf = append(buf, b.rest...)
	for i := range b.groups {
		g := &b.groups[i]
		t, v, found, simple := query.ScalarAt(e.Raw, g.path)
		switch {
		case !simple:
			buf = append(buf, g.all...)
		case !found:
		default:
			ids, ok := g.index.Lookup(t, v)
			if !ok {
				ids = g.all
			}
			buf = append(buf, ids...)
		}
	}
	return buf
}
