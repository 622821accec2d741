package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/query"
)

// Bounds of a subscription's JSON form.
const (
	// MaxSubscriptionJSONBytes bounds the JSON document of one
	// subscription (a request body, a stored definition).
	MaxSubscriptionJSONBytes = 64 << 10
	// MaxSubscriptionJSONDepth bounds how deeply its values nest.
	MaxSubscriptionJSONDepth = 32
	// MaxSubscriptionNameLength bounds a subscription's name.
	MaxSubscriptionNameLength = 100
)

// Problem is one thing wrong with a subscription's JSON form: where (a
// JSONPath, "$.sink.url", "$.filter['fullDocument.total']", "$.redact[1]";
// "$" for the document as a whole) and what.
type Problem struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

func (p Problem) String() string { return p.Path + ": " + p.Message }

// SubscriptionRoute is what a subscription routes, decoded and validated by
// the same code as [[rules]] and [[sinks]] entries: a rule and the webhook
// sink it alone routes to, both named after the subscription.
type SubscriptionRoute struct {
	// Rule is the subscription's rule; Rule.Sinks is [Sink.Name].
	Rule Rule
	// Sink is the subscription's webhook sink. Its signing secrets are
	// not part of the JSON form (the caller adds them); its
	// AllowPrivateNetworks is [subscriptions] allow_private_networks.
	Sink Sink
	// Backfill asks for a backfill of the source when the subscription is
	// created.
	Backfill bool
	// DisableAfter ("disable_after"; 0: off) disables the subscription
	// when its endpoint has failed without a success for that long.
	DisableAfter time.Duration
}

// MinDisableAfter is the shortest disable_after accepted.
const MinDisableAfter = time.Second

// subscriptionKeys are the keys of a subscription's JSON form, and
// subscriptionSinkKeys those of its "sink" object; anything else is refused.
var (
	subscriptionKeys     = []string{"name", "source", "operations", "filter", "fields", "redact", "envelope", "sink", "backfill", "disable_after"}
	subscriptionSinkKeys = []string{"type", "url", "headers", "batch_size", "transactions", "max_in_flight"}
)

// ParseSubscriptionJSON decodes and validates the JSON form of a
// subscription against cfg (its sources; its [subscriptions] table):
//
//	{"name", "source", "operations", "filter", "fields", "redact", "envelope",
//	 "sink": {"type": "webhook", "url", "headers", "batch_size", "transactions", "max_in_flight"},
//	 "backfill"}
//
// Decoding is strict (unknown fields, duplicate fields, null values and
// trailing data are problems) and bounded (MaxSubscriptionJSONBytes,
// MaxSubscriptionJSONDepth). The rule and the sink are then decoded by the
// decoder of [[rules]] and [[sinks]] entries, with every string taken
// literally: no ${VAR} expansion and no "file:" indirection, which only the
// operator's file may use. The filter is Extended JSON (so it may hold
// ObjectIds and dates) and is compiled as a rule's filter is; a regular
// expression MongoDB could backtrack on exponentially is refused
// (query.BacktrackRisk), since a subscription must not turn the pushed-down
// filter of the operator's source off.
//
// Names are not checked against the configuration's sinks and rules; the
// caller checks that (and what only it knows, such as the target's
// address). It returns the route, or nil and every problem found.
func ParseSubscriptionJSON(data []byte, cfg *Config) (*SubscriptionRoute, []Problem) {
	if len(data) > MaxSubscriptionJSONBytes {
		return nil, []Problem{{"$", fmt.Sprintf("the document is %d bytes, at most %d are accepted", len(data), MaxSubscriptionJSONBytes)}}
	}
	root, problems := readJSONTree(data)
	if root == nil {
		return nil, problems
	}
	problems = append(problems, strictKeys("$", root.tbl, subscriptionKeys)...)
	sinkVal := root.tbl.get("sink")
	delete(root.tbl.m, "sink")
	root.tbl.keys = deleteKey(root.tbl.keys, "sink")

	d := &decoder{lookupEnv: func(string) (string, bool) { return "", false }, literal: true,
		sinkTypes: []sinkType{builtinSinkTypes()[0]}}
	ro := d.obj("", root)
	backfill := ro.boolean("backfill", false)
	disableAfter, _ := ro.duration("disable_after", 0, MinDisableAfter)
	name, _ := ro.name()
	if len(name) > MaxSubscriptionNameLength {
		d.errorf("name", 0, "is %d characters, at most %d", len(name), MaxSubscriptionNameLength)
		name = ""
	}
	routeName := name
	if routeName == "" {
		routeName = "invalid" // reported already; lets the rest be checked
	}

	var sink Sink
	switch {
	case sinkVal == nil:
		d.errorf("sink", 0, `required field is missing (an object with "type": "webhook" and "url")`)
	case sinkVal.kind != kindTable:
		d.errorf("sink", 0, "expected an object, got %s", jsonTypeName(sinkVal))
	default:
		problems = append(problems, strictKeys("$.sink", sinkVal.tbl, subscriptionSinkKeys)...)
		sinkVal.tbl.set("name", &value{kind: kindString, str: routeName})
		sink, _ = d.sink(d.obj("sink", sinkVal))
		if sink.Webhook != nil {
			sink.Webhook.AllowPrivateNetworks = cfg.Subscriptions.AllowPrivateNetworks
		}
	}
	sink.Name = routeName

	// The rule routes to the sink alone; "sinks" is not part of the form.
	c := *cfg
	c.Sinks = []Sink{sink}
	root.tbl.set("sinks", &value{kind: kindArray, arr: []*value{{kind: kindString, str: routeName}}})
	rule, _ := d.rule(ro, &c)
	rule.Name = routeName
	if rule.Filter != nil {
		if raw, err := bson.Marshal(rule.Filter); err == nil {
			if why := query.BacktrackRisk(raw); why != "" {
				d.errorf("filter", 0, "refused: %s; rewrite the pattern without the nested repetition", why)
			}
		}
	}
	seen := map[Problem]bool{}
	for _, e := range d.errs {
		msg := strings.Replace(e.Msg, "required key is missing", "required field is missing", 1)
		p := Problem{Path: jsonPath(e.Key), Message: msg}
		if !seen[p] { // the name is read twice (for the sink, by the rule)
			seen[p] = true
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return nil, problems
	}
	return &SubscriptionRoute{Rule: rule, Sink: sink, Backfill: backfill, DisableAfter: disableAfter}, nil
}

// strictKeys removes from t the keys not in known and reports each.
func strictKeys(path string, t *table, known []string) []Problem {
	var out []Problem
	for _, k := range append([]string(nil), t.keys...) {
		if contains(known, k) {
			continue
		}
		out = append(out, Problem{Path: jsonPath(joinPath(strings.TrimPrefix(strings.TrimPrefix(path, "$"), "."), k)),
			Message: "unknown field" + didYouMean(k, known)})
		delete(t.m, k)
		t.keys = deleteKey(t.keys, k)
	}
	return out
}

func deleteKey(keys []string, k string) []string {
	out := keys[:0]
	for _, x := range keys {
		if x != k {
			out = append(out, x)
		}
	}
	return out
}

// jsonTypeName names a value's JSON type in messages.
func jsonTypeName(v *value) string {
	switch v.kind {
	case kindTable:
		return "an object"
	case kindArray:
		return "an array"
	case kindString:
		return "a string"
	case kindInteger, kindFloat:
		return "a number"
	case kindBool:
		return "a boolean"
	}
	return v.typeName()
}

var jsonMemberRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// jsonPath turns a key path of the decoder ("sink.headers.\"X-Key\"",
// "redact[1]") into a JSONPath ("$.sink.headers['X-Key']", "$.redact[1]").
func jsonPath(key string) string {
	var b strings.Builder
	b.WriteString("$")
	member := func(k string) {
		if jsonMemberRE.MatchString(k) {
			b.WriteString("." + k)
			return
		}
		k = strings.ReplaceAll(strings.ReplaceAll(k, `\`, `\\`), `'`, `\'`)
		b.WriteString("['" + k + "']")
	}
	for s := key; s != ""; {
		switch s[0] {
		case '.':
			s = s[1:]
		case '[':
			end := strings.IndexByte(s, ']')
			if end < 0 {
				end = len(s) - 1
			}
			b.WriteString(s[:end+1])
			s = s[end+1:]
		case '"':
			q, err := strconv.QuotedPrefix(s)
			if err != nil {
				member(s)
				s = ""
				continue
			}
			k, _ := strconv.Unquote(q)
			member(k)
			s = s[len(q):]
		default:
			end := strings.IndexAny(s, ".[")
			if end < 0 {
				end = len(s)
			}
			member(s[:end])
			s = s[end:]
		}
	}
	return b.String()
}

// jsonReader builds the decoder's tree from a JSON document.
type jsonReader struct {
	dec      *json.Decoder
	problems []Problem
}

// errJSONTooDeep stops reading a document nested past the bound.
var errJSONTooDeep = errors.New("too deep")

// readJSONTree reads data, which must be one JSON object, into a tree;
// the top-level "filter" is read as Extended JSON. It returns nil and the
// problems when data cannot be read at all.
func readJSONTree(data []byte) (*value, []Problem) {
	r := &jsonReader{dec: json.NewDecoder(bytes.NewReader(data))}
	r.dec.UseNumber()
	tok, err := r.dec.Token()
	if err != nil {
		return nil, []Problem{{"$", "invalid JSON: " + jsonErr(err)}}
	}
	if tok != json.Delim('{') {
		return nil, []Problem{{"$", "expected a JSON object"}}
	}
	root, err := r.object("", 1)
	if err != nil {
		if errors.Is(err, errJSONTooDeep) {
			return nil, []Problem{{"$", fmt.Sprintf("nested more than %d levels deep", MaxSubscriptionJSONDepth)}}
		}
		return nil, []Problem{{"$", "invalid JSON: " + jsonErr(err)}}
	}
	if _, err := r.dec.Token(); err != io.EOF {
		return nil, []Problem{{"$", "unexpected data after the JSON object"}}
	}
	return root, r.problems
}

func jsonErr(err error) string {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "unexpected end of the document"
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// object reads the members of an object whose '{' was read; path is its
// decoder key path.
func (r *jsonReader) object(path string, depth int) (*value, error) {
	if depth > MaxSubscriptionJSONDepth {
		return nil, errJSONTooDeep
	}
	v := &value{kind: kindTable, tbl: newTable()}
	for r.dec.More() {
		tok, err := r.dec.Token()
		if err != nil {
			return nil, err
		}
		k, _ := tok.(string)
		at := joinPath(path, k)
		var e *value
		if path == "" && k == "filter" {
			e, err = r.extJSON(at)
		} else {
			e, err = r.value(at, depth)
		}
		if err != nil {
			return nil, err
		}
		switch {
		case v.tbl.get(k) != nil:
			r.problems = append(r.problems, Problem{jsonPath(at), "duplicate field"})
		case e == nil: // null, reported
		default:
			v.tbl.set(k, e)
		}
	}
	if _, err := r.dec.Token(); err != nil { // '}'
		return nil, err
	}
	return v, nil
}

// value reads one value; nil (with a problem recorded) for null.
func (r *jsonReader) value(path string, depth int) (*value, error) {
	tok, err := r.dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			return r.object(path, depth+1)
		}
		if depth+1 > MaxSubscriptionJSONDepth {
			return nil, errJSONTooDeep
		}
		v := &value{kind: kindArray}
		for i := 0; r.dec.More(); i++ {
			e, err := r.value(indexPath(path, i), depth+1)
			if err != nil {
				return nil, err
			}
			if e != nil {
				v.arr = append(v.arr, e)
			}
		}
		if _, err := r.dec.Token(); err != nil { // ']'
			return nil, err
		}
		return v, nil
	case string:
		return &value{kind: kindString, str: t}, nil
	case bool:
		return &value{kind: kindBool, b: t}, nil
	case json.Number:
		if i, err := strconv.ParseInt(t.String(), 10, 64); err == nil {
			return &value{kind: kindInteger, i: i}, nil
		}
		f, err := t.Float64()
		if err != nil {
			r.problems = append(r.problems, Problem{jsonPath(path), fmt.Sprintf("number %s is out of range", t)})
			return nil, nil
		}
		return &value{kind: kindFloat, f: f}, nil
	case nil:
		r.problems = append(r.problems, Problem{jsonPath(path), "null is not accepted: leave the field out"})
		return nil, nil
	}
	return nil, fmt.Errorf("unexpected token %v", tok)
}

// extJSON reads a filter: a JSON object in Extended JSON (canonical or
// relaxed), so that ObjectIds, dates and decimals survive, turned into the
// tree a TOML inline table would give (its values TOML has no type for
// kept as BSON values).
func (r *jsonReader) extJSON(path string) (*value, error) {
	var raw json.RawMessage
	if err := r.dec.Decode(&raw); err != nil {
		return nil, err
	}
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		r.problems = append(r.problems, Problem{jsonPath(path), "null is not accepted: leave the field out"})
		return nil, nil
	}
	if depth := jsonDepth(raw); depth > MaxSubscriptionJSONDepth {
		return nil, errJSONTooDeep
	}
	var doc bson.D
	if err := bson.UnmarshalExtJSON(raw, false, &doc); err != nil {
		r.problems = append(r.problems, Problem{jsonPath(path), "expected an object in MongoDB query syntax (Extended JSON): " + err.Error()})
		return nil, nil
	}
	return bsonValue(doc), nil
}

// jsonDepth returns how deeply raw's arrays and objects nest.
func jsonDepth(raw []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}

// bsonValue converts a decoded BSON value into the tree.
func bsonValue(x any) *value {
	switch t := x.(type) {
	case bson.D:
		v := &value{kind: kindTable, tbl: newTable()}
		for _, e := range t {
			v.tbl.set(e.Key, bsonValue(e.Value))
		}
		return v
	case bson.A:
		v := &value{kind: kindArray}
		for _, e := range t {
			v.arr = append(v.arr, bsonValue(e))
		}
		return v
	case string:
		return &value{kind: kindString, str: t}
	case bool:
		return &value{kind: kindBool, b: t}
	case int32:
		return &value{kind: kindInteger, i: int64(t)}
	case int64:
		return &value{kind: kindInteger, i: t}
	case float64:
		return &value{kind: kindFloat, f: t}
	case nil:
		return &value{kind: kindBSON, raw: bson.Null{}}
	}
	return &value{kind: kindBSON, raw: x}
}
