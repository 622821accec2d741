package event

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// shapeChange builds a change event from the Extended JSON of its
// fullDocument, fullDocumentBeforeChange and updateDescription ("" leaves
// one out).
func shapeChange(t *testing.T, op, full, before, ud string) *Event {
	t.Helper()
	d := bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "8200000001"}}},
		{Key: "operationType", Value: op},
		{Key: "clusterTime", Value: bson.Timestamp{T: 1700000000, I: 1}},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "users"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: 7}}},
	}
	for _, f := range []struct{ k, v string }{{"fullDocument", full}, {"fullDocumentBeforeChange", before}, {"updateDescription", ud}} {
		if f.v == "" {
			continue
		}
		var raw bson.Raw
		if err := bson.UnmarshalExtJSON([]byte(f.v), false, &raw); err != nil {
			t.Fatalf("%s: %v", f.k, err)
		}
		d = append(d, bson.E{Key: f.k, Value: raw})
	}
	raw, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	e, err := FromChange("src", 1, raw)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// part returns the relaxed Extended JSON of a top-level field of the
// view's change, normalized through encoding/json, or "" when absent.
func part(t *testing.T, e *Event, k string) string {
	t.Helper()
	v, err := e.Raw.LookupErr(k)
	if err != nil {
		return ""
	}
	b, err := bson.MarshalExtJSON(bson.D{{Key: "v", Value: v}}, false, false)
	if err != nil {
		t.Fatal(err)
	}
	return normJSON(t, string(b[len(`{"v":`):len(b)-1]))
}

func normJSON(t *testing.T, s string) string {
	t.Helper()
	var x any
	if err := json.Unmarshal([]byte(s), &x); err != nil {
		t.Fatalf("%v: %s", err, s)
	}
	b, _ := json.Marshal(x)
	return string(b)
}

func mustShape(t *testing.T, spec ShapeSpec) *Shape {
	t.Helper()
	s, err := CompileShape(spec)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func excl(paths ...string) []Field {
	var fs []Field
	for _, p := range paths {
		fs = append(fs, Field{Path: p})
	}
	return fs
}

func incl(paths ...string) []Field {
	var fs []Field
	for _, p := range paths {
		fs = append(fs, Field{Path: p, Include: true})
	}
	return fs
}

func hmacHex(key, s string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(s))
	return hex.EncodeToString(m.Sum(nil))
}

const userDoc = `{"_id": 7, "name": "Ann", "email": "ann@x.org", "card": {"number": "4111", "exp": "12/30"},
	"address": {"city": "Oslo", "zip": "0150", "geo": {"lat": 1, "lng": 2}},
	"items": [{"sku": "a", "price": 1}, {"sku": "b", "price": 2}, 5, [{"sku": "c", "price": 3}]],
	"tags": ["x", "y"]}`

func TestShapeTable(t *testing.T) {
	ud := `{"updatedFields": {"email": "new@x.org", "name": "Bo", "card.number": "5500", "address": {"city": "Rome", "zip": "001"},
		"address.zip": "002", "items.1.sku": "bb", "items.1.price": 9, "items": [{"sku": "q", "price": 0}]},
		"removedFields": ["email", "card.exp", "phone", "address"],
		"truncatedArrays": [{"field": "items", "newSize": 1}, {"field": "tags", "newSize": 0}]}`
	cases := []struct {
		name string
		spec ShapeSpec
		// Want: normalized JSON of fullDocument, fullDocumentBeforeChange and
		// updateDescription ("" means absent).
		full, ud string
		skip     bool
	}{
		{
			name: "exclusion",
			spec: ShapeSpec{Fields: excl("fullDocument.email", "fullDocument.card", "fullDocument.address.zip", "fullDocument.items.price")},
			full: `{"_id":7,"name":"Ann","address":{"city":"Oslo","geo":{"lat":1,"lng":2}},"items":[{"sku":"a"},{"sku":"b"},5,[{"sku":"c"}]],"tags":["x","y"]}`,
			ud: `{"updatedFields":{"name":"Bo","address":{"city":"Rome"},"items.1.sku":"bb","items":[{"sku":"q"}]},` +
				`"removedFields":["phone","address"],"truncatedArrays":[{"field":"items","newSize":1},{"field":"tags","newSize":0}]}`,
		},
		{
			name: "inclusion (with _id by default), through arrays; scalars under a partial path dropped",
			spec: ShapeSpec{Fields: incl("fullDocument.name", "fullDocument.address.city", "fullDocument.items.sku")},
			full: `{"_id":7,"name":"Ann","address":{"city":"Oslo"},"items":[{"sku":"a"},{"sku":"b"},[{"sku":"c"}]]}`,
			ud: `{"updatedFields":{"name":"Bo","address":{"city":"Rome"},"items.1.sku":"bb","items":[{"sku":"q"}]},` +
				`"removedFields":["address"],"truncatedArrays":[{"field":"items","newSize":1}]}`,
		},
		{
			name: "inclusion without _id",
			spec: ShapeSpec{Fields: append(incl("fullDocument.name"), Field{Path: "fullDocument._id"})},
			full: `{"name":"Ann"}`,
			ud:   `{"updatedFields":{"name":"Bo"},"removedFields":[],"truncatedArrays":[]}`,
		},
		{
			name: "_id alone",
			spec: ShapeSpec{Fields: incl("fullDocument._id")},
			full: `{"_id":7}`,
			ud:   `{"updatedFields":{},"removedFields":[],"truncatedArrays":[]}`,
		},
		{
			name: "redact mask, ** and arrays, in updatedFields values and dotted keys",
			spec: ShapeSpec{Redact: []string{"fullDocument.email", "fullDocument.**.number", "fullDocument.items.price", "fullDocument.tags"}},
			full: `{"_id":7,"name":"Ann","email":"[REDACTED]","card":{"number":"[REDACTED]","exp":"12/30"},` +
				`"address":{"city":"Oslo","zip":"0150","geo":{"lat":1,"lng":2}},` +
				`"items":[{"sku":"a","price":"[REDACTED]"},{"sku":"b","price":"[REDACTED]"},5,[{"sku":"c","price":"[REDACTED]"}]],"tags":["[REDACTED]","[REDACTED]"]}`,
			ud: `{"updatedFields":{"email":"[REDACTED]","name":"Bo","card.number":"[REDACTED]","address":{"city":"Rome","zip":"001"},"address.zip":"002",` +
				`"items.1.sku":"bb","items.1.price":"[REDACTED]","items":[{"sku":"q","price":"[REDACTED]"}]},` +
				`"removedFields":["email","card.exp","phone","address"],"truncatedArrays":[{"field":"items","newSize":1},{"field":"tags","newSize":0}]}`,
		},
		{
			name: "redact ** matching zero fields and a whole sub-document",
			spec: ShapeSpec{Redact: []string{"fullDocument.**.geo", "fullDocument.**.card"}},
			full: `{"_id":7,"name":"Ann","email":"ann@x.org","card":"[REDACTED]","address":{"city":"Oslo","zip":"0150","geo":"[REDACTED]"},` +
				`"items":[{"sku":"a","price":1},{"sku":"b","price":2},5,[{"sku":"c","price":3}]],"tags":["x","y"]}`,
		},
		{
			name: "redact hash",
			spec: ShapeSpec{Redact: []string{"fullDocument.email"}, RedactHash: true, RedactKey: []byte("k-0123456789abcdef")},
			full: `{"_id":7,"name":"Ann","email":"` + hmacHex("k-0123456789abcdef", "ann@x.org") + `","card":{"number":"4111","exp":"12/30"},` +
				`"address":{"city":"Oslo","zip":"0150","geo":{"lat":1,"lng":2}},"items":[{"sku":"a","price":1},{"sku":"b","price":2},5,[{"sku":"c","price":3}]],"tags":["x","y"]}`,
		},
		{
			name: "no update description",
			spec: ShapeSpec{DropUpdateDescription: true, Fields: excl("fullDocument.items", "fullDocument.tags", "fullDocument.address", "fullDocument.card")},
			full: `{"_id":7,"name":"Ann","email":"ann@x.org"}`,
		},
		{
			name: "max_updated_fields_bytes",
			spec: ShapeSpec{MaxUpdatedFieldsBytes: 30, Fields: excl("fullDocument.items", "fullDocument.tags", "fullDocument.address", "fullDocument.card")},
			full: `{"_id":7,"name":"Ann","email":"ann@x.org"}`,
			ud:   `{"updatedFields":{"truncated":true},"removedFields":["email","phone"],"truncatedArrays":[]}`,
		},
		{
			name: "skip empty update",
			spec: ShapeSpec{SkipEmptyUpdates: true, Fields: incl("fullDocument.nickname")},
			full: `{"_id":7}`,
			ud:   `{"updatedFields":{},"removedFields":[],"truncatedArrays":[]}`,
			skip: true,
		},
		{
			name: "an update that keeps a change is not skipped",
			spec: ShapeSpec{SkipEmptyUpdates: true, Fields: incl("fullDocument.phone")},
			full: `{"_id":7}`,
			ud:   `{"updatedFields":{},"removedFields":["phone"],"truncatedArrays":[]}`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := shapeChange(t, "update", userDoc, userDoc, ud)
			v, skip := e.Shaped(mustShape(t, tc.spec))
			if v.ID != e.ID {
				t.Fatalf("id %q, want %q", v.ID, e.ID)
			}
			if skip != tc.skip {
				t.Fatalf("skip = %t, want %t", skip, tc.skip)
			}
			if got := part(t, v, "fullDocument"); got != normJSON(t, tc.full) {
				t.Errorf("fullDocument:\n got %s\nwant %s", got, normJSON(t, tc.full))
			}
			if got := part(t, v, "fullDocumentBeforeChange"); got != normJSON(t, tc.full) {
				t.Errorf("fullDocumentBeforeChange:\n got %s\nwant %s", got, normJSON(t, tc.full))
			}
			wantUD := ""
			if tc.ud != "" {
				wantUD = normJSON(t, tc.ud)
			} else if !tc.spec.DropUpdateDescription {
				wantUD = part(t, e, "updateDescription")
				if len(tc.spec.Redact) > 0 {
					wantUD = "" // checked below
				}
			}
			got := part(t, v, "updateDescription")
			if wantUD != "" && got != wantUD {
				t.Errorf("updateDescription:\n got %s\nwant %s", got, wantUD)
			}
			if tc.spec.DropUpdateDescription && got != "" {
				t.Errorf("updateDescription present: %s", got)
			}
			env, err := v.Envelope(false)
			if err != nil {
				t.Fatal(err)
			}
			for _, secret := range []string{"ann@x.org", "new@x.org", "4111", "5500"} {
				redacted := false
				for _, p := range tc.spec.Redact {
					redacted = redacted || strings.Contains(p, "email") && strings.Contains(secret, "@") || strings.Contains(p, "number") && !strings.Contains(secret, "@")
				}
				if redacted && strings.Contains(string(env), secret) {
					t.Errorf("redacted value %q in the envelope: %s", secret, env)
				}
			}
		})
	}
}

func TestShapeIdentityAndErrors(t *testing.T) {
	if s, err := CompileShape(ShapeSpec{}); s != nil || err != nil {
		t.Fatalf("zero spec: %v %v, want the identity", s, err)
	}
	e := shapeChange(t, "insert", `{"_id": 1}`, "", "")
	if v, skip := e.Shaped(nil); v != e || skip {
		t.Fatal("the identity must return the event itself")
	}
	bad := []struct {
		spec ShapeSpec
		want string
	}{
		{ShapeSpec{Fields: append(incl("fullDocument.a"), excl("fullDocument.b")...)}, "mixes inclusion and exclusion"},
		{ShapeSpec{Fields: excl("fullDocument.a..b")}, "empty field name"},
		{ShapeSpec{Fields: excl("email")}, `must start with "fullDocument."`},
		{ShapeSpec{Fields: excl("fullDocument")}, `must start with "fullDocument."`},
		{ShapeSpec{Fields: excl("fullDocument.**.a")}, "redact paths only"},
		{ShapeSpec{Redact: []string{"fullDocument.a."}}, "empty field name"},
		{ShapeSpec{Redact: []string{"fullDocument.a*"}}, "whole field name"},
		{ShapeSpec{Redact: []string{"fullDocument.$x"}}, `starting with "$"`},
		{ShapeSpec{Redact: []string{"fullDocument.a"}, RedactHash: true}, "needs a key"},
	}
	for _, b := range bad {
		if _, err := CompileShape(b.spec); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%+v: error %v, want %q", b.spec, err, b.want)
		}
	}
	// _id may be excluded from an inclusion, and included in an exclusion.
	for _, fs := range [][]Field{append(incl("fullDocument.a"), excl("fullDocument._id")...), append(excl("fullDocument.a"), incl("fullDocument._id")...)} {
		if _, err := CompileShape(ShapeSpec{Fields: fs}); err != nil {
			t.Errorf("%v: %v", fs, err)
		}
	}
}

func TestStricter(t *testing.T) {
	a := mustShape(t, ShapeSpec{Fields: incl("fullDocument.name", "fullDocument.address"), Redact: []string{"fullDocument.name"}, RedactHash: true, RedactKey: []byte("0123456789abcdef"), MaxUpdatedFieldsBytes: 100})
	b := mustShape(t, ShapeSpec{Fields: incl("fullDocument.address.city", "fullDocument.email"), Redact: []string{"fullDocument.name", "fullDocument.address.city"}, Envelope: FormDocument, MaxUpdatedFieldsBytes: 50, SkipEmptyUpdates: true})
	s := Stricter(a, b)
	if s.form != FormDocument || s.maxUF != 50 || !s.skip || s.dropUD {
		t.Fatalf("stricter: %s", s.fp)
	}
	if Stricter(b, a).fp != s.fp {
		t.Errorf("not symmetric:\n%s\n%s", Stricter(b, a).fp, s.fp)
	}
	if Stricter(nil, a) != a || Stricter(a, nil) != a {
		t.Error("nil is the identity")
	}
	e := shapeChange(t, "insert", userDoc, "", "")
	v, _ := e.Shaped(s)
	// Only address.city is kept by both inclusions (and _id); it is
	// masked by b's redaction; name is in a only.
	if got, want := part(t, v, "fullDocument"), normJSON(t, `{"_id":7,"address":{"city":"[REDACTED]"}}`); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	// A value redacted by a hash and by a mask is masked.
	c := mustShape(t, ShapeSpec{Redact: []string{"fullDocument.email"}, RedactHash: true, RedactKey: []byte("0123456789abcdef")})
	d := mustShape(t, ShapeSpec{Redact: []string{"fullDocument.email"}})
	v, _ = e.Shaped(Stricter(c, d))
	if got, _ := v.Raw.LookupErr("fullDocument", "email"); got.StringValue() != RedactMask {
		t.Errorf("email = %v, want the mask", got)
	}
	// Exclusions add up.
	x := Stricter(mustShape(t, ShapeSpec{Fields: excl("fullDocument.email")}), mustShape(t, ShapeSpec{Fields: excl("fullDocument.card", "fullDocument.items", "fullDocument.tags", "fullDocument.address")}))
	v, _ = e.Shaped(x)
	if got, want := part(t, v, "fullDocument"), normJSON(t, `{"_id":7,"name":"Ann"}`); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestShapeForms(t *testing.T) {
	e := shapeChange(t, "update", `{"_id": 7, "name": "Ann", "ssn": "123"}`, "", `{"updatedFields": {"ssn": "123"}, "removedFields": []}`)
	e.Rules = []string{"r"}
	doc := mustShape(t, ShapeSpec{Envelope: FormDocument, Redact: []string{"fullDocument.ssn"}})
	v, _ := e.Shaped(doc)
	body, err := v.Envelope(false)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := normJSON(t, string(body)), normJSON(t, `{"_id":7,"name":"Ann","ssn":"[REDACTED]"}`); got != want {
		t.Errorf("document body %s, want %s", got, want)
	}
	rec, err := v.Record(false)
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]any
	if err := json.Unmarshal(rec, &r); err != nil {
		t.Fatal(err)
	}
	if r["id"] != e.ID || r["operationType"] != "update" || r["updateDescription"] != nil || r["fullDocument"] == nil || strings.Contains(string(rec), "123") {
		t.Errorf("record %s", rec)
	}
	wantMeta := []MetaField{{"id", e.ID}, {"operationType", "update"}, {"ns", "shop.users"}, {"documentKey", `{"_id":7}`}, {"clusterTime", "2023-11-14T22:13:20Z"}}
	if got := v.Metadata(); !reflect.DeepEqual(got, wantMeta) {
		t.Errorf("metadata %v, want %v", got, wantMeta)
	}
	key := mustShape(t, ShapeSpec{Envelope: FormKey})
	k, _ := e.Shaped(key)
	body, _ = k.Envelope(false)
	if got, want := string(body), `{"id":"src:8200000001","operationType":"update","ns":{"db":"shop","coll":"users"},"documentKey":{"_id":7}}`; got != want {
		t.Errorf("key body %s, want %s", got, want)
	}
	if rec, _ := k.Record(false); string(rec) != string(body) {
		t.Errorf("key record %s", rec)
	}
	// A delete has no post-image: the document body is null.
	d := shapeChange(t, "delete", "", "", "")
	dv, _ := d.Shaped(doc)
	if body, _ := dv.Envelope(false); string(body) != "null" {
		t.Errorf("delete document body %s", body)
	}
}

// TestShapedOncePerShape: sinks with equal shapes share one view and one
// encoding, from any number of goroutines.
func TestShapedOncePerShape(t *testing.T) {
	e := shapeChange(t, "insert", userDoc, "", "")
	spec := ShapeSpec{Fields: excl("fullDocument.email"), Envelope: FormFull}
	s1, s2 := mustShape(t, spec), mustShape(t, spec)
	other := mustShape(t, ShapeSpec{Fields: excl("fullDocument.card")})
	var wg sync.WaitGroup
	views := make([]*Event, 32)
	bodies := make([][]byte, 32)
	for i := range views {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := s1
			if i%2 == 1 {
				s = s2
			}
			views[i], _ = e.Shaped(s)
			bodies[i], _ = views[i].Envelope(false)
		}()
	}
	wg.Wait()
	for i := range views {
		if views[i] != views[0] || &bodies[i][0] != &bodies[0][0] {
			t.Fatal("equal shapes must share one view and one encoding")
		}
	}
	o, _ := e.Shaped(other)
	if o == views[0] || o.Unshaped() != e || views[0].Unshaped() != e {
		t.Fatal("views")
	}
	// A view of a view is a view of the event.
	if vv, _ := views[0].Shaped(other); vv != o {
		t.Fatal("a view's views are its event's")
	}
}

// TestShapeLiteralDottedFields: MongoDB 5.0+ stores field names with dots
// ({"card.number": ...}). A redact path or an exclusion matches such a
// field as the path its dots spell, as well as the nested field, and mixed
// forms ({"card": {"number.last4": ...}}); an inclusion keeps real nested
// fields only (a dotted field is left out, never let through unshaped).
func TestShapeLiteralDottedFields(t *testing.T) {
	doc := bson.D{
		{Key: "_id", Value: 7},
		{Key: "card.number", Value: "4111-dotted"},
		{Key: "card", Value: bson.D{{Key: "number", Value: "4222-nested"}, {Key: "number.last4", Value: "1111"}, {Key: "exp", Value: "12/30"}}},
		{Key: "card.exp", Value: "1/31"},
		{Key: "cardx.number", Value: "keep"},
		{Key: "person.ssn", Value: "123-45-6789"},
		{Key: "a", Value: bson.D{{Key: "b.ssn", Value: "987-65-4321"}, {Key: "c", Value: 1}}},
	}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "8200000001"}}},
		{Key: "operationType", Value: "replace"},
		{Key: "clusterTime", Value: bson.Timestamp{T: 1700000000, I: 1}},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "users"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: 7}}},
		{Key: "fullDocument", Value: doc},
		{Key: "fullDocumentBeforeChange", Value: doc},
	})
	if err != nil {
		t.Fatal(err)
	}
	e, err := FromChange("src", 1, raw)
	if err != nil {
		t.Fatal(err)
	}
	const m = `"[REDACTED]"`
	cases := []struct {
		name string
		spec ShapeSpec
		want string
	}{
		{
			name: "redact a path",
			spec: ShapeSpec{Redact: []string{"fullDocument.card.number"}},
			want: `{"_id":7,"card.number":` + m + `,"card":{"number":` + m + `,"number.last4":` + m + `,"exp":"12/30"},"card.exp":"1/31","cardx.number":"keep",` +
				`"person.ssn":"123-45-6789","a":{"b.ssn":"987-65-4321","c":1}}`,
		},
		{
			name: "redact a parent",
			spec: ShapeSpec{Redact: []string{"fullDocument.card"}},
			want: `{"_id":7,"card.number":` + m + `,"card":` + m + `,"card.exp":` + m + `,"cardx.number":"keep",` +
				`"person.ssn":"123-45-6789","a":{"b.ssn":"987-65-4321","c":1}}`,
		},
		{
			name: "redact with **",
			spec: ShapeSpec{Redact: []string{"fullDocument.**.ssn"}},
			want: `{"_id":7,"card.number":"4111-dotted","card":{"number":"4222-nested","number.last4":"1111","exp":"12/30"},"card.exp":"1/31","cardx.number":"keep",` +
				`"person.ssn":` + m + `,"a":{"b.ssn":` + m + `,"c":1}}`,
		},
		{
			name: "redact hash",
			spec: ShapeSpec{Redact: []string{"fullDocument.person.ssn"}, RedactHash: true, RedactKey: []byte("k-0123456789abcdef")},
			want: `{"_id":7,"card.number":"4111-dotted","card":{"number":"4222-nested","number.last4":"1111","exp":"12/30"},"card.exp":"1/31","cardx.number":"keep",` +
				`"person.ssn":"` + hmacHex("k-0123456789abcdef", "123-45-6789") + `","a":{"b.ssn":"987-65-4321","c":1}}`,
		},
		{
			name: "exclude",
			spec: ShapeSpec{Fields: excl("fullDocument.card.number", "fullDocument.a.b")},
			want: `{"_id":7,"card":{"exp":"12/30"},"card.exp":"1/31","cardx.number":"keep","person.ssn":"123-45-6789","a":{"c":1}}`,
		},
		{
			name: "include",
			spec: ShapeSpec{Fields: incl("fullDocument.card.exp", "fullDocument.a")},
			want: `{"_id":7,"card":{"exp":"12/30"},"a":{"b.ssn":"987-65-4321","c":1}}`,
		},
		{
			name: "include with a redaction",
			spec: ShapeSpec{Fields: incl("fullDocument.a"), Redact: []string{"fullDocument.a.b.ssn"}},
			want: `{"_id":7,"a":{"b.ssn":` + m + `,"c":1}}`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, _ := e.Shaped(mustShape(t, tc.spec))
			for _, k := range []string{"fullDocument", "fullDocumentBeforeChange"} {
				if got, want := part(t, v, k), normJSON(t, tc.want); got != want {
					t.Errorf("%s:\n got %s\nwant %s", k, got, want)
				}
			}
			env, err := v.Envelope(false)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(tc.name, "redact a") && strings.Contains(string(env), "4111-dotted") {
				t.Errorf("the envelope leaks the dotted field: %s", env)
			}
		})
	}
	// Stricter keeps the dotted reading of each side's redactions.
	a := mustShape(t, ShapeSpec{Redact: []string{"fullDocument.card.number"}})
	b := mustShape(t, ShapeSpec{Fields: incl("fullDocument.card", "fullDocument.cardx")})
	v, _ := e.Shaped(Stricter(b, a))
	if got, want := part(t, v, "fullDocument"), normJSON(t, `{"_id":7,"card":{"number":`+m+`,"number.last4":`+m+`,"exp":"12/30"}}`); got != want {
		t.Errorf("stricter:\n got %s\nwant %s", got, want)
	}
}
