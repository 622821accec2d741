package mongowire

import (
	"math"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func pipelineStages(cmd *command) ([]bson.Raw, error) {
	v, err := cmd.body.LookupErr("pipeline")
	if err != nil {
		return nil, cmdErr(codeFailedToParse, "'pipeline' option must be specified as an array")
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, cmdErr(codeTypeMismatch, "'pipeline' option must be specified as an array")
	}
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
		if elems, _ := d.Elements(); len(elems) != 1 {
			return nil, cmdErr(codeLocation40324+1, "A pipeline stage specification object must contain exactly one field.")
		}
		stages = append(stages, d)
	}
	return stages, nil
}

func (s *Server) cmdAggregate(cmd *command, dst []byte) ([]byte, error) {
	stages, err := pipelineStages(cmd)
	if err != nil {
		return nil, err
	}
	if len(stages) > 0 && stages[0].Index(0).Key() == "$changeStream" {
		return s.openChangeStream(cmd, dst, stages)
	}
	for _, st := range stages {
		if st.Index(0).Key() == splitStage {
			// A stage with ChangeStreamRequirement::kRequiresChangeStream.
			return nil, cmdErr(codeIllegalOperation, "%s can only be used in a $changeStream pipeline.", splitStage)
		}
	}
	if _, ok := cmd.body.Lookup("cursor").DocumentOK(); !ok {
		if _, err := cmd.body.LookupErr("explain"); err != nil {
			return nil, cmdErr(codeFailedToParse, "The 'cursor' option is required, except for aggregate with the explain argument")
		}
	}
	target := cmd.body.Lookup("aggregate")
	name, ok := target.StringValueOK()
	if !ok {
		return nil, cmdErr(codeInvalidNamespace, "mongowire supports database-level aggregate only with $changeStream")
	}
	if !validCollName(name) {
		return nil, cmdErr(codeInvalidNamespace, "Invalid namespace specified '%s.%s'", cmd.db, name)
	}
	// A leading $match is evaluated while scanning.
	var filter bson.Raw
	if len(stages) > 0 && stages[0].Index(0).Key() == "$match" {
		filter, _ = stages[0].Index(0).Value().DocumentOK()
		stages = stages[1:]
	}
	docs, err := s.queryDocs(cmd, cmd.db, name, filter, nil, nil, 0, 0)
	if err != nil {
		return nil, err
	}
	for _, st := range stages {
		if docs, err = applyStage(docs, st); err != nil {
			return nil, err
		}
	}
	return s.replyCursor(cmd, dst, cmd.db+"."+name, docs)
}

// applyStage runs one aggregation stage over docs.
func applyStage(docs []bson.Raw, stage bson.Raw) ([]bson.Raw, error) {
	e := stage.Index(0)
	name, arg := e.Key(), e.Value()
	switch name {
	case "$match":
		f, ok := arg.DocumentOK()
		if !ok {
			return nil, cmdErr(15959, "the match filter must be an expression in an object")
		}
		m, err := compileFilter(f)
		if err != nil {
			return nil, filterErr(err)
		}
		out := docs[:0:0]
		for _, d := range docs {
			if m.Match(d) {
				out = append(out, d)
			}
		}
		return out, nil
	case "$sort":
		spec, ok := arg.DocumentOK()
		if !ok {
			return nil, cmdErr(15973, "the $sort key specification must be an object")
		}
		order, err := compileSort(spec)
		if err != nil {
			return nil, cmdErr(codeBadValue, "%v", err)
		}
		out := slices.Clone(docs)
		slices.SortStableFunc(out, order.Compare)
		return out, nil
	case "$skip":
		n := int(num(arg))
		if n >= len(docs) {
			return nil, nil
		}
		return docs[n:], nil
	case "$limit":
		n := int(num(arg))
		if n <= 0 {
			return nil, cmdErr(15958, "the limit must be positive")
		}
		if n < len(docs) {
			return docs[:n], nil
		}
		return docs, nil
	case "$project", "$unset":
		var spec bson.Raw
		switch {
		case name == "$project":
			spec, _ = arg.DocumentOK()
		case arg.Type == bson.TypeString:
			spec = bson.Raw(bsoncore.NewDocumentBuilder().AppendInt32(arg.StringValue(), 0).Build())
		default:
			b := bsoncore.NewDocumentBuilder()
			vals, _ := arg.Array().Values()
			for _, v := range vals {
				b.AppendInt32(v.StringValue(), 0)
			}
			spec = bson.Raw(b.Build())
		}
		out := make([]bson.Raw, 0, len(docs))
		now := time.Now()
		for _, d := range docs {
			p, err := aggProject(d, spec, now)
			if err != nil {
				return nil, err
			}
			out = append(out, p)
		}
		return out, nil
	case "$count":
		field, ok := arg.StringValueOK()
		if !ok || field == "" || strings.HasPrefix(field, "$") || strings.Contains(field, ".") {
			return nil, cmdErr(40156, "the count field must be a non-empty string")
		}
		if len(docs) == 0 {
			return nil, nil
		}
		return []bson.Raw{bson.Raw(bsoncore.NewDocumentBuilder().AppendInt32(field, int32(len(docs))).Build())}, nil
	case "$group":
		spec, ok := arg.DocumentOK()
		if !ok {
			return nil, cmdErr(15947, "a group's fields must be specified in an object")
		}
		return group(docs, spec)
	}
	if out, ok, err := applyExprStage(docs, stage, time.Now()); ok {
		return out, err
	}
	return nil, cmdErr(codeLocation40324, "Unrecognized pipeline stage name: '%s' (mongowire supports $match $sort $skip $limit $project $unset $count $group $addFields $set $replaceRoot $replaceWith)", name)
}

type accum struct {
	op       string
	expr     bson.RawValue
	sum      float64
	intSum   int64
	isDouble bool
	count    int
	val      bson.RawValue
	set      bool
	items    []bson.RawValue
	seen     map[string]bool
}

func (a *accum) add(env *exprEnv) error {
	v, err := evalExpression(env, a.expr)
	if err != nil {
		return err
	}
	switch a.op {
	case "$sum", "$avg":
		if v.IsNumber() {
			a.count++
			a.sum += num(v)
			if v.Type == bson.TypeDouble || v.Type == bson.TypeDecimal128 {
				a.isDouble = true
			} else {
				i, _ := v.AsInt64OK()
				a.intSum += i
			}
		}
	case "$count":
		a.count++
	case "$min", "$max":
		if v.Type == 0 || v.Type == bson.TypeNull {
			return nil
		}
		c := compareValues(v, a.val)
		if !a.set || a.op == "$min" && c < 0 || a.op == "$max" && c > 0 {
			a.val, a.set = v, true
		}
	case "$first":
		if !a.set {
			a.val, a.set = v, true
		}
	case "$last":
		a.val, a.set = v, true
	case "$push":
		if v.Type != 0 {
			a.items = append(a.items, v)
		}
	case "$addToSet":
		if v.Type != 0 {
			k := valueKey(v)
			if !a.seen[k] {
				a.seen[k] = true
				a.items = append(a.items, v)
			}
		}
	}
	return nil
}

func (a *accum) appendResult(dst []byte, key string) []byte {
	switch a.op {
	case "$sum":
		switch {
		case a.isDouble:
			return bsoncore.AppendDoubleElement(dst, key, a.sum)
		case a.intSum >= math.MinInt32 && a.intSum <= math.MaxInt32:
			return bsoncore.AppendInt32Element(dst, key, int32(a.intSum))
		}
		return bsoncore.AppendInt64Element(dst, key, a.intSum)
	case "$count":
		return bsoncore.AppendInt32Element(dst, key, int32(a.count))
	case "$avg":
		if a.count == 0 {
			return bsoncore.AppendNullElement(dst, key)
		}
		return bsoncore.AppendDoubleElement(dst, key, a.sum/float64(a.count))
	case "$push", "$addToSet":
		idx, d := bsoncore.AppendArrayElementStart(dst, key)
		for i, v := range a.items {
			d = bsoncore.AppendValueElement(d, arrayKey(i), bsoncore.Value{Type: bsoncore.Type(v.Type), Data: v.Value})
		}
		d, _ = bsoncore.AppendArrayEnd(d, idx)
		return d
	}
	if !a.set || a.val.Type == 0 {
		return bsoncore.AppendNullElement(dst, key)
	}
	return bsoncore.AppendValueElement(dst, key, bsoncore.Value{Type: bsoncore.Type(a.val.Type), Data: a.val.Value})
}

func group(docs []bson.Raw, spec bson.Raw) ([]bson.Raw, error) {
	idExpr, err := spec.LookupErr("_id")
	if err != nil {
		return nil, cmdErr(15955, "a group specification must include an _id")
	}
	type grp struct {
		id   bson.RawValue
		accs []*accum
	}
	fields, _ := spec.Elements()
	newAccs := func() ([]*accum, error) {
		var accs []*accum
		for _, f := range fields {
			if f.Key() == "_id" {
				continue
			}
			d, ok := f.Value().DocumentOK()
			if !ok {
				return nil, cmdErr(40234, "The field '%s' must be an accumulator object", f.Key())
			}
			op := d.Index(0)
			switch op.Key() {
			case "$sum", "$avg", "$min", "$max", "$first", "$last", "$push", "$addToSet", "$count":
			default:
				return nil, cmdErr(15952, "unknown group operator '%s'", op.Key())
			}
			accs = append(accs, &accum{op: op.Key(), expr: op.Value(), seen: map[string]bool{}})
		}
		return accs, nil
	}
	var order []*grp
	groups := map[string]*grp{}
	now := time.Now()
	for _, d := range docs {
		env := &exprEnv{root: d, now: now}
		id, err := evalExpression(env, idExpr)
		if err != nil {
			return nil, err
		}
		if id.Type == 0 {
			id = bson.RawValue{Type: bson.TypeNull}
		}
		k := valueKey(id)
		g := groups[k]
		if g == nil {
			accs, err := newAccs()
			if err != nil {
				return nil, err
			}
			g = &grp{id: id, accs: accs}
			groups[k] = g
			order = append(order, g)
		}
		for _, a := range g.accs {
			if err := a.add(env); err != nil {
				return nil, err
			}
		}
	}
	out := make([]bson.Raw, 0, len(order))
	for _, g := range order {
		idx, dst := bsoncore.AppendDocumentStart(nil)
		dst = bsoncore.AppendValueElement(dst, "_id", bsoncore.Value{Type: bsoncore.Type(g.id.Type), Data: g.id.Value})
		i := 0
		for _, f := range fields {
			if f.Key() == "_id" {
				continue
			}
			dst = g.accs[i].appendResult(dst, f.Key())
			i++
		}
		dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
		out = append(out, bson.Raw(dst))
	}
	return out, nil
}
