package mongowire

// The aggregation $project stage with computed fields, and $redact.
//
// From the manual (reference/operator/aggregation/project, .../redact) and
// src/mongo/db/exec/inclusion_projection_executor.cpp:
//   - a field set to 1/true (any non-zero number) is included, 0/false
//     excluded; any other value (a string, "$path", {$op: ...}, an array)
//     is an expression whose value becomes the field ("computed field"),
//     which puts the projection in inclusion mode; only _id may be
//     excluded in inclusion mode;
//   - {a: {b: <spec>}} and {"a.b": <spec>} both project inside a;
//   - _id is kept unless excluded;
//   - included fields come in the input document's order, computed fields
//     after them in the specification's order (InclusionNode::applyToDocument
//     then addComputedFields);
//   - a computed field that evaluates to missing is left out.
// A projection with only 0/1 values is the find projection (project()).
//
// $redact evaluates its expression at the top level and, for $$DESCEND, in
// every embedded document (also inside arrays): $$KEEP keeps the level as it
// is, $$PRUNE drops it, $$DESCEND keeps it and examines its subdocuments.
// Here field paths and $$ROOT refer to the level examined (MongoDB keeps
// $$ROOT at the top document).

import (
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// projNode is one level of an inclusion projection.
type projNode struct {
	include  map[string]bool      // fields kept as they are
	children map[string]*projNode // fields projected further
	computed []projComputed       // in specification order
	order    []string             // specification order of children (for missing ones)
}

type projComputed struct {
	name string
	expr bson.RawValue
}

// isComputedProjection reports whether spec has a value other than a
// number or boolean at any depth.
func isComputedProjection(spec bson.Raw) bool {
	elems, _ := spec.Elements()
	for _, e := range elems {
		v := e.Value()
		switch {
		case v.IsNumber() || v.Type == bson.TypeBoolean:
		case v.Type == bson.TypeEmbeddedDocument && len(v.Value) > 5 && !strings.HasPrefix(bson.Raw(v.Value).Index(0).Key(), "$"):
			if isComputedProjection(bson.Raw(v.Value)) {
				return true
			}
		default:
			return true
		}
	}
	return false
}

func newProjNode() *projNode {
	return &projNode{include: map[string]bool{}, children: map[string]*projNode{}}
}

// child returns the node for name, creating it.
func (n *projNode) child(name string) *projNode {
	c := n.children[name]
	if c == nil {
		c = newProjNode()
		n.children[name] = c
		n.order = append(n.order, name)
	}
	return c
}

// parse adds spec's fields under the node; excludeID reports _id: 0 at the top.
func (n *projNode) parse(spec bson.Raw, top bool) (excludeID bool, err error) {
	elems, err := spec.Elements()
	if err != nil {
		return false, cmdErr(codeBadValue, "%v", err)
	}
	for _, e := range elems {
		key, v := e.Key(), e.Value()
		if strings.HasPrefix(key, "$") {
			return false, cmdErr(16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField.")
		}
		parts := strings.Split(key, ".")
		node := n
		for _, p := range parts[:len(parts)-1] {
			node = node.child(p)
		}
		last := parts[len(parts)-1]
		switch {
		case v.IsNumber() || v.Type == bson.TypeBoolean:
			on := v.Type == bson.TypeBoolean && v.Boolean() || v.IsNumber() && num(v) != 0
			if !on {
				if top && key == "_id" {
					excludeID = true
					continue
				}
				return false, cmdErr(31254, "Invalid $project :: caused by :: Cannot do exclusion on field %s in inclusion projection", key)
			}
			node.include[last] = true
		case v.Type == bson.TypeEmbeddedDocument && len(v.Value) > 5 && !strings.HasPrefix(bson.Raw(v.Value).Index(0).Key(), "$"):
			if _, err := node.child(last).parse(bson.Raw(v.Value), false); err != nil {
				return false, err
			}
		default:
			node.computed = append(node.computed, projComputed{name: last, expr: v})
		}
	}
	return excludeID, nil
}

// apply projects doc (a document at this level).
func (n *projNode) apply(env *exprEnv, doc bson.Raw, out []byte) ([]byte, error) {
	elems, _ := doc.Elements()
	done := map[string]bool{}
	for _, e := range elems {
		k := e.Key()
		switch {
		case n.include[k]:
			out = append(out, e...)
			done[k] = true
		case n.children[k] != nil:
			v, err := n.children[k].applyValue(env, e.Value())
			if err != nil {
				return nil, err
			}
			done[k] = true
			if v.Type != 0 {
				out = bsoncore.AppendValueElement(out, k, bsoncore.Value{Type: bsoncore.Type(v.Type), Data: v.Value})
			}
		}
	}
	// Children with computed fields below them create missing documents.
	for _, k := range n.order {
		if done[k] || !n.children[k].hasComputed() {
			continue
		}
		sub, err := n.children[k].apply(env, bson.Raw(emptyDoc), nil)
		if err != nil {
			return nil, err
		}
		out = appendSubdoc(out, k, sub)
	}
	for _, c := range n.computed {
		v, err := evalExpression(env, c.expr)
		if err != nil {
			return nil, err
		}
		if v.Type != 0 {
			out = bsoncore.AppendValueElement(out, c.name, bsoncore.Value{Type: bsoncore.Type(v.Type), Data: v.Value})
		}
	}
	return out, nil
}

func (n *projNode) hasComputed() bool {
	if len(n.computed) > 0 {
		return true
	}
	for _, c := range n.children {
		if c.hasComputed() {
			return true
		}
	}
	return false
}

// appendSubdoc appends the elements body (without a document header) as
// embedded document key.
func appendSubdoc(dst []byte, key string, body []byte) []byte {
	idx, dst := bsoncore.AppendDocumentElementStart(dst, key)
	dst = append(dst, body...)
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	return dst
}

// applyValue projects a field's value: documents are projected, arrays
// element by element (non-documents dropped), scalars drop out unless
// computed fields create a document.
func (n *projNode) applyValue(env *exprEnv, v bson.RawValue) (bson.RawValue, error) {
	switch v.Type {
	case bson.TypeEmbeddedDocument:
		body, err := n.apply(env, bson.Raw(v.Value), nil)
		if err != nil {
			return valMissing, err
		}
		return bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: appendSubdocValue(body)}, nil
	case bson.TypeArray:
		vals, _ := bson.Raw(v.Value).Values()
		var out []bson.RawValue
		for _, el := range vals {
			r, err := n.applyValue(env, el)
			if err != nil {
				return valMissing, err
			}
			if r.Type != 0 {
				out = append(out, r)
			}
		}
		return arrayVal(out), nil
	}
	if n.hasComputed() {
		body, err := n.apply(env, bson.Raw(emptyDoc), nil)
		if err != nil {
			return valMissing, err
		}
		return bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: appendSubdocValue(body)}, nil
	}
	return valMissing, nil
}

func appendSubdocValue(body []byte) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = append(d, body...)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// aggProject applies an aggregation $project specification to doc.
func aggProject(doc, spec bson.Raw, now time.Time) (bson.Raw, error) {
	if !isComputedProjection(spec) {
		p, err := project(doc, spec)
		if err != nil {
			return nil, cmdErr(codeBadValue, "%v", err)
		}
		return p, nil
	}
	root := newProjNode()
	excludeID, err := root.parse(spec, true)
	if err != nil {
		return nil, err
	}
	if !excludeID && root.children["_id"] == nil && !hasComputedNamed(root, "_id") {
		root.include["_id"] = true
	}
	body, err := root.apply(&exprEnv{root: doc, now: now}, doc, nil)
	if err != nil {
		return nil, err
	}
	return bson.Raw(appendSubdocValue(body)), nil
}

func hasComputedNamed(n *projNode, name string) bool {
	for _, c := range n.computed {
		if c.name == name {
			return true
		}
	}
	return false
}

// Sentinels of $redact's system variables.
const (
	redactKeep    = "$$KEEP"
	redactPrune   = "$$PRUNE"
	redactDescend = "$$DESCEND"
)

// redact applies a $redact expression to doc; ok is false when the top
// level is pruned.
func redact(doc bson.Raw, expr bson.RawValue, now time.Time) (bson.Raw, bool, error) {
	v, err := evalExpression(&exprEnv{root: doc, now: now}, expr)
	if err != nil {
		return nil, false, err
	}
	s, _ := v.StringValueOK()
	switch s {
	case redactKeep:
		return doc, true, nil
	case redactPrune:
		return nil, false, nil
	case redactDescend:
	default:
		return nil, false, cmdErr(17053, "$redact's expression should not return anything aside from the variables $$KEEP, $$DESCEND, and $$PRUNE, but returned %s", v)
	}
	elems, _ := doc.Elements()
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		r, keep, err := redactValue(e.Value(), expr, now)
		if err != nil {
			return nil, false, err
		}
		if keep {
			out = bsoncore.AppendValueElement(out, e.Key(), bsoncore.Value{Type: bsoncore.Type(r.Type), Data: r.Value})
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return bson.Raw(out), true, nil
}

func redactValue(v bson.RawValue, expr bson.RawValue, now time.Time) (bson.RawValue, bool, error) {
	switch v.Type {
	case bson.TypeEmbeddedDocument:
		d, keep, err := redact(bson.Raw(v.Value), expr, now)
		if err != nil || !keep {
			return valMissing, false, err
		}
		return bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: d}, true, nil
	case bson.TypeArray:
		vals, _ := bson.Raw(v.Value).Values()
		var out []bson.RawValue
		for _, el := range vals {
			r, keep, err := redactValue(el, expr, now)
			if err != nil {
				return valMissing, false, err
			}
			if keep {
				out = append(out, r)
			}
		}
		return arrayVal(out), true, nil
	}
	return v, true, nil
}
