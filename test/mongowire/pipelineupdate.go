package mongowire

// Update pipelines (an array as the update of update/findAndModify) and the
// aggregation stages they share with aggregate: $addFields/$set, $unset,
// $replaceRoot/$replaceWith.
//
// From the manual (reference/method/db.collection.updateOne "Update with
// an Aggregation Pipeline", tutorial/update-documents-with-aggregation-
// pipeline, reference/operator/aggregation/addFields, .../replaceWith):
//   - the stages allowed in an update are $addFields/$set, $project/$unset
//     and $replaceRoot/$replaceWith (mongowire has no $project here);
//   - $addFields evaluates every expression against the stage's input
//     document, then sets the fields in order: an existing field keeps its
//     position, a new one is appended; {a: {b: <expr>}} is the same as
//     {"a.b": <expr>} (a document whose first key is not an operator is a
//     nested specification); a scalar on the way is replaced by a
//     document; a value that evaluates to missing ($$REMOVE) removes the
//     field;
//   - $replaceWith/$replaceRoot must produce a document (error 40228);
//   - the _id cannot change (error 66 ImmutableField); a pipeline result
//     without _id keeps the old one;
//   - $$NOW is one value for the whole command;
//   - an upsert applies the pipeline to the document seeded from the
//     filter's equality fields.
// Setting a dotted path through an array (which MongoDB maps over the
// elements) is not implemented and is an error here.
//
// Change events of a pipeline update are "update" events whose
// updateDescription comes from a diff of the old and new documents, as the
// server's oplog delta does (src/mongo/db/update/document_diff_calculator.cpp:
// changed or added fields are updatedFields, recursing into embedded
// documents and arrays, a shortened array in truncatedArrays; missing
// fields removedFields). mongowire never turns a large delta into a
// replacement.

import (
	"bytes"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// pipelineStagesOf validates an update pipeline (a BSON array).
func pipelineStagesOf(arr bson.Raw) ([]bson.Raw, *CommandError) {
	vals, err := arr.Values()
	if err != nil {
		return nil, cmdErr(codeFailedToParse, "%v", err)
	}
	stages := make([]bson.Raw, 0, len(vals))
	for _, v := range vals {
		d, ok := v.DocumentOK()
		if !ok {
			return nil, cmdErr(codeTypeMismatch, "Each element of the 'pipeline' array must be an object")
		}
		elems, _ := d.Elements()
		if len(elems) != 1 {
			return nil, cmdErr(codeLocation40324+1, "A pipeline stage specification object must contain exactly one field.")
		}
		switch k := elems[0].Key(); k {
		case "$addFields", "$set", "$unset", "$replaceRoot", "$replaceWith":
		case "$project":
			return nil, cmdErr(codeInvalidOptions, "mongowire does not implement $project in update pipelines")
		default:
			return nil, cmdErr(codeInvalidOptions, "%s is not allowed to be used within an update", k)
		}
		stages = append(stages, d)
	}
	return stages, nil
}

// applyPipelineUpdate runs an update pipeline over doc (an upsert's seed
// when insert) and returns the new document and the change event's
// updateDescription.
func applyPipelineUpdate(doc, pipeline bson.Raw, now time.Time) (bson.Raw, bson.Raw, *CommandError) {
	stages, ce := pipelineStagesOf(pipeline)
	if ce != nil {
		return nil, nil, ce
	}
	out := doc
	for _, st := range stages {
		var err error
		if out, err = applyDocStage(out, st.Index(0), now); err != nil {
			return nil, nil, asCmdErr(err)
		}
	}
	oldID, errOld := doc.LookupErr("_id")
	hasOld := errOld == nil
	if newID, err := out.LookupErr("_id"); err == nil {
		if hasOld && (newID.Type != oldID.Type || !bytes.Equal(newID.Value, oldID.Value)) {
			return nil, nil, cmdErr(codeImmutableField, "Performing an update on the path '_id' would modify the immutable field '_id'")
		}
	} else if hasOld {
		out = withIDFirst(out, oldID)
	}
	return out, diffUpdateDescription(doc, out), nil
}

func asCmdErr(err error) *CommandError {
	if ce, ok := err.(*CommandError); ok {
		return ce
	}
	return cmdErr(codeBadValue, "%v", err)
}

func withIDFirst(doc bson.Raw, id bson.RawValue) bson.Raw {
	idx, out := bsoncore.AppendDocumentStart(nil)
	out = bsoncore.AppendValueElement(out, "_id", bsoncore.Value{Type: bsoncore.Type(id.Type), Data: id.Value})
	elems, _ := doc.Elements()
	for _, e := range elems {
		if e.Key() != "_id" {
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return bson.Raw(out)
}

// applyDocStage applies one $addFields/$set/$unset/$replaceRoot/
// $replaceWith stage to doc.
func applyDocStage(doc bson.Raw, stage bson.RawElement, now time.Time) (bson.Raw, error) {
	name, arg := stage.Key(), stage.Value()
	env := &exprEnv{root: doc, now: now}
	switch name {
	case "$addFields", "$set":
		spec, ok := arg.DocumentOK()
		if !ok {
			return nil, cmdErr(40272, "%s specification stage must be an object, got %s", name, typeName(arg.Type))
		}
		type assign struct {
			path []string
			val  bson.RawValue
		}
		var sets []assign
		var walk func(prefix []string, spec bson.Raw) error
		walk = func(prefix []string, spec bson.Raw) error {
			elems, err := spec.Elements()
			if err != nil {
				return cmdErr(codeBadValue, "%v", err)
			}
			for _, e := range elems {
				if strings.HasPrefix(e.Key(), "$") {
					return cmdErr(16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField.")
				}
				path := append(append([]string(nil), prefix...), strings.Split(e.Key(), ".")...)
				if sub, ok := e.Value().DocumentOK(); ok && len(sub) > 5 && !strings.HasPrefix(sub.Index(0).Key(), "$") {
					if err := walk(path, sub); err != nil {
						return err
					}
					continue
				}
				v, err := evalExpression(env, e.Value())
				if err != nil {
					return err
				}
				sets = append(sets, assign{path, v})
			}
			return nil
		}
		if err := walk(nil, spec); err != nil {
			return nil, err
		}
		out := doc
		for _, s := range sets {
			var err error
			if out, err = setPath(out, s.path, s.val); err != nil {
				return nil, err
			}
		}
		return out, nil
	case "$unset":
		var paths []string
		switch arg.Type {
		case bson.TypeString:
			paths = []string{arg.StringValue()}
		case bson.TypeArray:
			vals, _ := bson.Raw(arg.Value).Values()
			for _, v := range vals {
				s, ok := v.StringValueOK()
				if !ok {
					return nil, cmdErr(31120, "$unset specification must be a string or an array containing only string values")
				}
				paths = append(paths, s)
			}
		default:
			return nil, cmdErr(31002, "$unset specification must be a string or an array")
		}
		out := doc
		for _, p := range paths {
			var err error
			if out, err = setPath(out, strings.Split(p, "."), valMissing); err != nil {
				return nil, err
			}
		}
		return out, nil
	case "$replaceRoot", "$replaceWith":
		e := arg
		if name == "$replaceRoot" {
			spec, ok := arg.DocumentOK()
			if !ok {
				return nil, cmdErr(40228, "expected an object as specification for $replaceRoot stage, got %s", typeName(arg.Type))
			}
			nr, err := spec.LookupErr("newRoot")
			if err != nil {
				return nil, cmdErr(40231, "no newRoot specified for the $replaceRoot stage")
			}
			e = nr
		}
		v, err := evalExpression(env, e)
		if err != nil {
			return nil, err
		}
		d, ok := v.DocumentOK()
		if !ok {
			return nil, cmdErr(40228, "'replacement document' must evaluate to an object, but resulting value was: %s. Type of resulting value: '%s'.", v, typeName(v.Type))
		}
		return d, nil
	}
	return nil, cmdErr(codeLocation40324, "Unrecognized pipeline stage name: '%s'", name)
}

// setPath returns doc with the field at path set to v, or removed when v
// is missing.
func setPath(doc bson.Raw, path []string, v bson.RawValue) (bson.Raw, error) {
	elems, err := doc.Elements()
	if err != nil {
		return nil, cmdErr(codeBadValue, "%v", err)
	}
	idx, out := bsoncore.AppendDocumentStart(nil)
	found := false
	for _, e := range elems {
		if e.Key() != path[0] {
			out = append(out, e...)
			continue
		}
		found = true
		if len(path) == 1 {
			if v.Type != 0 {
				out = bsoncore.AppendValueElement(out, path[0], bsoncore.Value{Type: bsoncore.Type(v.Type), Data: v.Value})
			}
			continue
		}
		child := e.Value()
		switch child.Type {
		case bson.TypeEmbeddedDocument:
			sub, err := setPath(bson.Raw(child.Value), path[1:], v)
			if err != nil {
				return nil, err
			}
			out = bsoncore.AppendDocumentElement(out, path[0], sub)
		case bson.TypeArray:
			return nil, cmdErr(codeBadValue, "mongowire does not implement setting or removing %s through the array at %s", strings.Join(path, "."), path[0])
		default:
			if v.Type == 0 { // removing below a scalar: nothing to do
				out = append(out, e...)
				continue
			}
			sub, _ := setPath(bson.Raw(emptyDoc), path[1:], v)
			out = bsoncore.AppendDocumentElement(out, path[0], sub)
		}
	}
	if !found && v.Type != 0 {
		if len(path) == 1 {
			out = bsoncore.AppendValueElement(out, path[0], bsoncore.Value{Type: bsoncore.Type(v.Type), Data: v.Value})
		} else {
			sub, _ := setPath(bson.Raw(emptyDoc), path[1:], v)
			out = bsoncore.AppendDocumentElement(out, path[0], sub)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return bson.Raw(out), nil
}

// diffUpdateDescription returns {updatedFields, removedFields,
// truncatedArrays} turning old into new. Arrays are diffed element by
// element as document_diff_calculator.cpp does: changed elements are
// updated fields "a.<i>" (documents and arrays inside recursed into),
// appended ones too, and a shorter array is reported in truncatedArrays
// as {field, newSize}.
func diffUpdateDescription(old, new bson.Raw) bson.Raw {
	upd := bsoncore.NewDocumentBuilder()
	var removed []string
	trunc := bsoncore.NewArrayBuilder()
	var diff func(prefix string, a, b bson.Raw)
	var diffArray func(path string, a, b bson.Raw)
	diffArray = func(path string, a, b bson.Raw) {
		av, _ := a.Values()
		bv, _ := b.Values()
		for i, nv := range bv {
			key := path + "." + arrayKey(i)
			if i >= len(av) {
				upd.AppendValue(key, bsoncore.Value{Type: bsoncore.Type(nv.Type), Data: nv.Value})
				continue
			}
			ov := av[i]
			switch {
			case ov.Type == nv.Type && bytes.Equal(ov.Value, nv.Value):
			case ov.Type == bson.TypeEmbeddedDocument && nv.Type == bson.TypeEmbeddedDocument:
				diff(key+".", bson.Raw(ov.Value), bson.Raw(nv.Value))
			case ov.Type == bson.TypeArray && nv.Type == bson.TypeArray:
				diffArray(key, bson.Raw(ov.Value), bson.Raw(nv.Value))
			default:
				upd.AppendValue(key, bsoncore.Value{Type: bsoncore.Type(nv.Type), Data: nv.Value})
			}
		}
		if len(bv) < len(av) {
			trunc.AppendDocument(bsoncore.NewDocumentBuilder().AppendString("field", path).AppendInt32("newSize", int32(len(bv))).Build())
		}
	}
	diff = func(prefix string, a, b bson.Raw) {
		bElems, _ := b.Elements()
		for _, e := range bElems {
			nv := e.Value()
			ov, err := a.LookupErr(e.Key())
			switch {
			case err != nil:
				upd.AppendValue(prefix+e.Key(), bsoncore.Value{Type: bsoncore.Type(nv.Type), Data: nv.Value})
			case ov.Type == nv.Type && bytes.Equal(ov.Value, nv.Value):
			case ov.Type == bson.TypeEmbeddedDocument && nv.Type == bson.TypeEmbeddedDocument:
				diff(prefix+e.Key()+".", bson.Raw(ov.Value), bson.Raw(nv.Value))
			case ov.Type == bson.TypeArray && nv.Type == bson.TypeArray:
				diffArray(prefix+e.Key(), bson.Raw(ov.Value), bson.Raw(nv.Value))
			default:
				upd.AppendValue(prefix+e.Key(), bsoncore.Value{Type: bsoncore.Type(nv.Type), Data: nv.Value})
			}
		}
		aElems, _ := a.Elements()
		for _, e := range aElems {
			if _, err := b.LookupErr(e.Key()); err != nil {
				removed = append(removed, prefix+e.Key())
			}
		}
	}
	diff("", old, new)
	rem := bsoncore.NewArrayBuilder()
	for _, r := range removed {
		rem.AppendString(r)
	}
	return bson.Raw(bsoncore.NewDocumentBuilder().
		AppendDocument("updatedFields", upd.Build()).
		AppendArray("removedFields", rem.Build()).
		AppendArray("truncatedArrays", trunc.Build()).
		Build())
}

// applyExprStage runs an $addFields/$set/$replaceRoot/$replaceWith stage
// of an aggregate; ok is false for other stages.
func applyExprStage(docs []bson.Raw, stage bson.Raw, now time.Time) (out []bson.Raw, ok bool, err error) {
	e := stage.Index(0)
	switch e.Key() {
	case "$addFields", "$set", "$replaceRoot", "$replaceWith":
	default:
		return nil, false, nil
	}
	out = make([]bson.Raw, 0, len(docs))
	for _, d := range docs {
		nd, err := applyDocStage(d, e, now)
		if err != nil {
			return nil, true, err
		}
		out = append(out, nd)
	}
	return out, true, nil
}
