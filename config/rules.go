package config

import (
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/query"
)

// rule decodes one [[rules]] entry and checks its references against the
// sources and sinks decoded so far (all of them: rules are decoded last).
func (d *decoder) rule(o *obj, cfg *Config) (r Rule, nameVal *value) {
	r.Name, nameVal = o.name()

	var src *Source
	if name, ok := o.reqString("source"); ok {
		r.Source = name
		if src = cfg.Source(name); src == nil {
			names := make([]string, 0, len(cfg.Sources))
			for _, s := range cfg.Sources {
				names = append(names, s.Name)
			}
			d.errorf(o.keyPath("source"), o.lineOf("source"), "unknown source %q%s", name, didYouMean(name, names))
		}
	}

	if ops, elems, v := o.strings("operations"); v != nil && !o.bad["operations"] {
		if len(ops) == 0 {
			d.errorf(o.keyPath("operations"), v.line, "must not be empty (omit it to match every operation)")
		}
		seen := map[string]bool{}
		for i, op := range ops {
			if !d.checkEnum(indexPath(o.keyPath("operations"), i), elems[i].line, op, operationTypes) {
				continue
			}
			if seen[op] {
				d.errorf(indexPath(o.keyPath("operations"), i), elems[i].line, "operation %q is listed twice", op)
				continue
			}
			seen[op] = true
			r.Operations = append(r.Operations, op)
		}
	}

	if nss, elems, v := o.strings("namespaces"); v != nil && !o.bad["namespaces"] {
		if len(nss) == 0 {
			d.errorf(o.keyPath("namespaces"), v.line, "must not be empty (omit it to match every namespace)")
		}
		if src != nil && src.Collection != "" {
			d.errorf(o.keyPath("namespaces"), v.line, "source %q watches the single collection %s.%s; namespaces apply only to database and cluster sources", src.Name, src.Database, src.Collection)
		} else {
			for i, s := range nss {
				ns, msg := parseNamespace(s)
				if msg == "" && src != nil && src.Database != "" && ns.Database != src.Database {
					msg = fmt.Sprintf("namespace %q is outside database %q watched by source %q", s, src.Database, src.Name)
				}
				if msg != "" {
					d.errorf(indexPath(o.keyPath("namespaces"), i), elems[i].line, "%s", msg)
					continue
				}
				r.Namespaces = append(r.Namespaces, ns)
			}
		}
	}

	if f := o.lookup("filter"); f != nil {
		if f.kind != kindTable {
			o.typeError("filter", f, "a table (an inline table in MongoDB query syntax)")
		} else {
			r.Filter = d.filter(o.keyPath("filter"), f)
		}
	}

	sinks, elems, v := o.strings("sinks")
	switch {
	case v == nil:
		o.missing("sinks")
	case o.bad["sinks"]:
	case len(sinks) == 0:
		d.errorf(o.keyPath("sinks"), v.line, "must list at least one sink")
	default:
		names := make([]string, 0, len(cfg.Sinks))
		for _, s := range cfg.Sinks {
			names = append(names, s.Name)
		}
		seen := map[string]bool{}
		for i, name := range sinks {
			switch {
			case cfg.Sink(name) == nil:
				d.errorf(o.keyPath("sinks"), elems[i].line, "unknown sink %q%s", name, didYouMean(name, names))
			case seen[name]:
				d.errorf(o.keyPath("sinks"), elems[i].line, "sink %q is listed twice", name)
			default:
				seen[name] = true
				r.Sinks = append(r.Sinks, name)
			}
		}
	}
	r.Shape = d.shape(o)
	o.done()
	return r, nameVal
}

// parseNamespace parses "db.coll" or "db.*"; msg is non-empty when invalid.
func parseNamespace(s string) (Namespace, string) {
	db, coll, ok := strings.Cut(s, ".")
	if !ok || db == "" || coll == "" {
		return Namespace{}, fmt.Sprintf(`invalid namespace %q: want "db.coll" or "db.*"`, s)
	}
	if msg := checkDBName(db); msg != "" {
		return Namespace{}, fmt.Sprintf("invalid namespace %q: %s", s, msg)
	}
	if coll == "*" {
		return Namespace{Database: db}, ""
	}
	if msg := checkCollName(coll); msg != "" || strings.Contains(coll, "*") {
		return Namespace{}, fmt.Sprintf(`invalid namespace %q: want "db.coll" or "db.*"`, s)
	}
	return Namespace{Database: db, Collection: coll}, ""
}

// filter converts a TOML table to a BSON document (keys in file order) and
// validates it as a MongoDB query; nil when invalid (reported).
func (d *decoder) filter(path string, v *value) bson.D {
	top := *v
	top.dotted = false // filter."a.b" = 1 in a [[rules]] table is fine
	doc, ok := d.toBSON(path, &top).(bson.D)
	if !ok {
		return nil
	}
	raw, err := bson.Marshal(doc)
	if err != nil {
		d.errorf(path, v.line, "cannot encode filter: %v", err)
		return nil
	}
	if err := compileFilter(raw); err != nil {
		d.errorf(path, v.line, "invalid filter: %v", err)
		return nil
	}
	return doc
}

// toBSON converts a TOML value: integers to int64, floats to double, offset
// and local date-times and local dates to BSON dates (local ones in UTC),
// arrays to bson.A, tables to bson.D. It returns nil after reporting a value
// that cannot be converted.
func (d *decoder) toBSON(path string, v *value) any {
	switch v.kind {
	case kindString:
		s, ok := d.expand(path, v.line, v.str)
		if !ok {
			return nil
		}
		return s
	case kindInteger:
		return v.i
	case kindFloat:
		return v.f
	case kindBool:
		return v.b
	case kindDateTime, kindLocalDateTime, kindLocalDate:
		return bson.NewDateTimeFromTime(v.t)
	case kindLocalTime:
		d.errorf(path, v.line, "local times are not supported in filters; use a date-time")
		return nil
	case kindBSON:
		return v.raw
	case kindArray:
		a := make(bson.A, 0, len(v.arr))
		ok := true
		for i, e := range v.arr {
			x := d.toBSON(indexPath(path, i), e)
			if x == nil {
				ok = false
			}
			a = append(a, x)
		}
		if !ok {
			return nil
		}
		return a
	case kindTable:
		if v.dotted {
			// { fullDocument.status = "x" } is { fullDocument = { status = "x" } }
			// in TOML: an exact match on the whole sub-document, which is
			// almost never what was meant.
			example := path[strings.LastIndex(path, ".")+1:]
			for w := v; w.kind == kindTable && len(w.tbl.keys) > 0; {
				k := w.tbl.keys[0]
				example += "." + k
				if w = w.tbl.m[k]; !w.dotted {
					break
				}
			}
			d.errorf(path, v.line, "an unquoted dotted key makes a nested document, which matches the whole field exactly; quote the field path instead: %q = ...", example)
			return nil
		}
		doc := make(bson.D, 0, len(v.tbl.keys))
		ok := true
		for _, k := range v.tbl.keys {
			x := d.toBSON(joinPath(path, k), v.tbl.m[k])
			if x == nil {
				ok = false
			}
			doc = append(doc, bson.E{Key: k, Value: x})
		}
		if !ok {
			return nil
		}
		return doc
	}
	return nil
}

// compileFilter validates a filter document.
func compileFilter(filter bson.Raw) error {
	_, err := query.Compile(filter)
	return err
}
