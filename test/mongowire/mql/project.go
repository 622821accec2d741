package mql

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/changegate/changegate/internal/bsonraw"
	"github.com/changegate/changegate/query"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Projection is a compiled find projection. It is immutable and safe for
// concurrent use.
type Projection struct {
	root      *projNode
	inclusion bool
	empty     bool
}

type projAction int

const (
	projNone projAction = iota // interior node: see children
	projInclude
	projExclude
	projSlice
	projElemMatch
)

type projNode struct {
	action   projAction
	children map[string]*projNode
	// $slice arguments: skip is applied first (negative counts from the
	// end), then limit elements are kept; hasSkip distinguishes [skip, limit]
	// from the single-number form.
	skip, limit int
	hasSkip     bool
	elemMatch   *query.Filter
}

// Project applies a find projection to doc; it is shorthand for
// [CompileProjection] followed by [Projection.Apply].
func Project(doc bson.Raw, projection bson.Raw) (bson.Raw, error) {
	p, err := CompileProjection(projection)
	if err != nil {
		return nil, err
	}
	return p.Apply(doc), nil
}

// CompileProjection validates a find projection.
//
// Values 1/true (or any non-zero number) include a field, 0/false exclude
// it; a projection is either an inclusion or an exclusion, except that _id
// may be excluded from an inclusion ("cannot do exclusion on field b in
// inclusion projection" otherwise). _id is included unless excluded
// explicitly. Dotted paths address embedded documents and the documents
// inside arrays. {$slice: n} and {$slice: [skip, limit]} are supported in
// either mode and {$elemMatch: query} on top-level fields (it counts as an
// inclusion). The positional "$" projection, $meta and aggregation
// expressions are not supported and are errors.
func CompileProjection(projection bson.Raw) (*Projection, error) {
	p := &Projection{root: &projNode{children: map[string]*projNode{}}}
	if len(projection) == 0 {
		p.empty = true
		return p, nil
	}
	if err := projection.Validate(); err != nil {
		return nil, fmt.Errorf("invalid projection document: %w", err)
	}
	mode := 0 // 0 unknown, 1 inclusion, -1 exclusion
	idExcluded := false
	count := 0
	it := bsonraw.NewIter(projection)
	for {
		k, t, v, ok := it.Next()
		if !ok {
			break
		}
		count++
		path := string(k)
		if path == "" || strings.HasPrefix(path, "$") || strings.HasPrefix(path, ".") || strings.HasSuffix(path, ".") || strings.Contains(path, "..") {
			return nil, fmt.Errorf("invalid projection path %q", path)
		}
		if strings.HasSuffix(path, ".$") || strings.Contains(path, ".$.") {
			return nil, fmt.Errorf("positional projection is not supported at %s", path)
		}
		n := &projNode{}
		fieldMode := 0
		switch {
		case t == bson.TypeBoolean || bsonraw.IsNumeric(t):
			if bsonraw.Truthy(t, v) {
				n.action, fieldMode = projInclude, 1
			} else {
				n.action, fieldMode = projExclude, -1
			}
		case t == bson.TypeEmbeddedDocument:
			op, ot, ov := bsonraw.FirstElem(v)
			if bsonraw.CountElems(v) != 1 {
				return nil, fmt.Errorf("unsupported projection expression at %s", path)
			}
			switch string(op) {
			case "$slice":
				if err := n.parseSlice(path, ot, ov); err != nil {
					return nil, err
				}
				n.action = projSlice
			case "$elemMatch":
				if strings.Contains(path, ".") {
					return nil, fmt.Errorf("cannot use $elemMatch projection on a nested field at %s", path)
				}
				if ot != bson.TypeEmbeddedDocument {
					return nil, fmt.Errorf("$elemMatch needs an object at %s", path)
				}
				f, err := query.Compile(ov)
				if err != nil {
					return nil, err
				}
				n.action, n.elemMatch, fieldMode = projElemMatch, f, 1
			default:
				return nil, fmt.Errorf("unsupported projection operator %s at %s", op, path)
			}
		default:
			return nil, fmt.Errorf("unsupported projection value at %s: aggregation expressions are not supported", path)
		}
		if path == "_id" && fieldMode == -1 {
			idExcluded = true
		} else if path != "_id" && fieldMode != 0 {
			switch {
			case mode == 0:
				mode = fieldMode
			case mode == 1 && fieldMode == -1:
				return nil, fmt.Errorf("cannot do exclusion on field %s in inclusion projection", path)
			case mode == -1 && fieldMode == 1:
				return nil, fmt.Errorf("cannot do inclusion on field %s in exclusion projection", path)
			}
		}
		if err := p.root.insert(path, bsonraw.SplitPath(path), n); err != nil {
			return nil, err
		}
	}
	if mode == 0 {
		// Only _id and/or $slice: an _id-only inclusion ({_id: 1}) is an
		// inclusion, anything else an exclusion.
		if id := p.root.children["_id"]; id != nil && id.action == projInclude && count == 1 {
			mode = 1
		} else {
			mode = -1
		}
	}
	p.inclusion = mode == 1
	if p.inclusion && !idExcluded {
		if _, ok := p.root.children["_id"]; !ok {
			p.root.children["_id"] = &projNode{action: projInclude}
		}
	}
	if p.inclusion && idExcluded {
		delete(p.root.children, "_id")
	}
	return p, nil
}

func (n *projNode) parseSlice(path string, t bson.Type, v []byte) error {
	switch {
	case bsonraw.IsNumeric(t):
		l, _ := bsonraw.TruncInt(t, v)
		n.limit = int(l)
	case t == bson.TypeArray:
		var args []bson.RawValue
		it := bsonraw.NewIter(v)
		for {
			_, et, ev, ok := it.Next()
			if !ok {
				break
			}
			if !bsonraw.IsNumeric(et) {
				return fmt.Errorf("$slice arguments must be numbers at %s", path)
			}
			args = append(args, bsonraw.Value(et, ev))
		}
		if len(args) != 2 {
			return fmt.Errorf("$slice array argument must have 2 elements at %s", path)
		}
		s, _ := bsonraw.TruncInt(args[0].Type, args[0].Value)
		l, _ := bsonraw.TruncInt(args[1].Type, args[1].Value)
		if l <= 0 {
			return fmt.Errorf("$slice limit must be positive at %s", path)
		}
		n.skip, n.limit, n.hasSkip = int(s), int(l), true
	default:
		return fmt.Errorf("$slice needs a number or an array of two numbers at %s", path)
	}
	return nil
}

func (n *projNode) insert(full string, parts []bsonraw.PathPart, leaf *projNode) error {
	cur := n
	for i, part := range parts {
		if cur.action != projNone {
			return fmt.Errorf("path collision at %s", full)
		}
		if cur.children == nil {
			cur.children = map[string]*projNode{}
		}
		child := cur.children[part.Name]
		if i == len(parts)-1 {
			if child != nil {
				return fmt.Errorf("path collision at %s", full)
			}
			cur.children[part.Name] = leaf
			return nil
		}
		if child == nil {
			child = &projNode{}
			cur.children[part.Name] = child
		}
		cur = child
	}
	return nil
}

// Apply projects doc. A malformed document yields whatever could be read
// of it.
func (p *Projection) Apply(doc bson.Raw) bson.Raw {
	if p.empty {
		return append(bson.Raw(nil), doc...)
	}
	out := make([]byte, 0, len(doc))
	return bson.Raw(p.projectDoc(out, doc, p.root))
}

func (p *Projection) projectDoc(dst, doc []byte, n *projNode) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	it := bsonraw.NewIter(doc)
	for {
		k, t, v, ok := it.Next()
		if !ok {
			break
		}
		child := n.children[string(k)]
		dst = p.projectField(dst, k, t, v, child)
	}
	dst = append(dst, 0)
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start))
	return dst
}

func (p *Projection) projectField(dst, key []byte, t bson.Type, v []byte, child *projNode) []byte {
	if child == nil {
		if p.inclusion {
			return dst
		}
		return appendElem(dst, t, key, v)
	}
	switch child.action {
	case projInclude:
		return appendElem(dst, t, key, v)
	case projExclude:
		return dst
	case projSlice:
		if t != bson.TypeArray {
			return appendElem(dst, t, key, v)
		}
		return appendElem(dst, t, key, sliceArray(v, child))
	case projElemMatch:
		if t != bson.TypeArray {
			return dst
		}
		it := bsonraw.NewIter(v)
		for {
			_, et, ev, ok := it.Next()
			if !ok {
				return dst
			}
			if (et == bson.TypeEmbeddedDocument || et == bson.TypeArray) && child.elemMatch.Match(ev) {
				arr := appendElem([]byte{0, 0, 0, 0}, et, []byte("0"), ev)
				arr = append(arr, 0)
				binary.LittleEndian.PutUint32(arr, uint32(len(arr)))
				return appendElem(dst, bson.TypeArray, key, arr)
			}
		}
	}
	// Interior node: descend.
	switch t {
	case bson.TypeEmbeddedDocument:
		return appendElem(dst, t, key, p.projectDoc(nil, v, child))
	case bson.TypeArray:
		return appendElem(dst, t, key, p.projectArray(v, child))
	}
	if p.inclusion {
		return dst
	}
	return appendElem(dst, t, key, v)
}

// projectArray applies an interior projection node to each element of an
// array: documents and nested arrays are projected; in an inclusion
// projection other elements are dropped, in an exclusion they are kept.
func (p *Projection) projectArray(arr []byte, n *projNode) []byte {
	dst := []byte{0, 0, 0, 0}
	it := bsonraw.NewIter(arr)
	i := 0
	for {
		_, t, v, ok := it.Next()
		if !ok {
			break
		}
		var ev []byte
		switch t {
		case bson.TypeEmbeddedDocument:
			ev = p.projectDoc(nil, v, n)
		case bson.TypeArray:
			ev = p.projectArray(v, n)
		default:
			if p.inclusion {
				continue
			}
			ev = v
		}
		dst = appendElem(dst, t, strconv.AppendInt(nil, int64(i), 10), ev)
		i++
	}
	dst = append(dst, 0)
	binary.LittleEndian.PutUint32(dst, uint32(len(dst)))
	return dst
}

func sliceArray(arr []byte, n *projNode) []byte {
	total := bsonraw.CountElems(arr)
	from, to := 0, total
	if n.hasSkip {
		from = n.skip
		if from < 0 {
			from = max(total+from, 0)
		}
		from = min(from, total)
		to = min(from+n.limit, total)
	} else if n.limit >= 0 {
		to = min(n.limit, total)
	} else {
		from = max(total+n.limit, 0)
	}
	dst := []byte{0, 0, 0, 0}
	it := bsonraw.NewIter(arr)
	for i, j := 0, 0; ; i++ {
		_, t, v, ok := it.Next()
		if !ok {
			break
		}
		if i >= from && i < to {
			dst = appendElem(dst, t, strconv.AppendInt(nil, int64(j), 10), v)
			j++
		}
	}
	dst = append(dst, 0)
	binary.LittleEndian.PutUint32(dst, uint32(len(dst)))
	return dst
}

func appendElem(dst []byte, t bson.Type, key []byte, v []byte) []byte {
	dst = append(dst, byte(t))
	dst = append(dst, key...)
	dst = append(dst, 0)
	return append(dst, v...)
}
