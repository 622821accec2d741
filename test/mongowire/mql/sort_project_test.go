package mql

import (
	"slices"
	"strings"
	"testing"

	"github.com/changegate/changegate/test/bsontest"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// https://www.mongodb.com/docs/manual/reference/method/cursor.sort/
// https://www.mongodb.com/docs/manual/reference/bson-type-comparison-order/#arrays
func TestSort(t *testing.T) {
	restaurants := []string{
		`{"_id": 1, "name": "Central Park Cafe", "borough": "Manhattan"}`,
		`{"_id": 2, "name": "Rock A Feller Bar and Grill", "borough": "Queens"}`,
		`{"_id": 3, "name": "Empire State Pub", "borough": "Brooklyn"}`,
		`{"_id": 4, "name": "Stan's Pizzaria", "borough": "Manhattan"}`,
		`{"_id": 5, "name": "Jane's Deli", "borough": "Brooklyn"}`,
	}
	mixed := []string{
		`{"_id": 1, "type": null}`,
		`{"_id": 2}`,
		`{"_id": 3, "type": 1}`,
		`{"_id": 4, "type": "a"}`,
		`{"_id": 5, "type": [2, 5]}`,
		`{"_id": 6, "type": []}`,
		`{"_id": 7, "type": {"$numberDecimal": "1.5"}}`,
		`{"_id": 8, "type": {"x": 1}}`,
	}
	arrays := []string{
		`{"_id": 1, "a": [1, 9], "s": {"t": [{"u": 7}, {"u": 2}]}}`,
		`{"_id": 2, "a": [3, 4], "s": {"t": [{"u": 5}]}}`,
		`{"_id": 3, "a": 5, "s": {"t": {"u": 3}}}`,
	}
	cases := []struct {
		name string
		docs []string
		spec string
		want string
	}{
		{"borough then _id", restaurants, `{"borough": 1, "_id": 1}`, "3 5 1 4 2"},
		{"borough descending then _id", restaurants, `{"borough": -1, "_id": 1}`, "2 1 4 3 5"},
		{"name", restaurants, `{"name": 1}`, "1 3 5 2 4"},
		{"mixed types ascending", mixed, `{"type": 1, "_id": 1}`, "6 1 2 3 7 5 4 8"},
		{"mixed types descending", mixed, `{"type": -1, "_id": 1}`, "8 4 5 7 3 1 2 6"},
		{"array min ascending", arrays, `{"a": 1}`, "1 2 3"},
		{"array max descending", arrays, `{"a": -1}`, "1 3 2"},
		{"dotted through array of docs ascending", arrays, `{"s.t.u": 1}`, "1 3 2"},
		{"dotted through array of docs descending", arrays, `{"s.t.u": -1.0}`, "1 2 3"},
		{"empty spec keeps order", arrays, `{}`, "1 2 3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := CompileSort(bsontest.Doc(t, tc.spec))
			if err != nil {
				t.Fatal(err)
			}
			docs := make([]bson.Raw, len(tc.docs))
			for i, d := range tc.docs {
				docs[i] = bsontest.Doc(t, d)
			}
			slices.SortStableFunc(docs, s.Compare)
			var got []string
			for _, d := range docs {
				got = append(got, bsontest.FieldString(t, d, "_id"))
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Errorf("order %s, want %s", g, tc.want)
			}
		})
	}
}

func TestCompileSortErrors(t *testing.T) {
	cases := []struct{ spec, want string }{
		{`{"a": 2}`, "sort key ordering must be 1 (for ascending) or -1 (for descending) at a"},
		{`{"a": "asc"}`, "sort key ordering must be 1 (for ascending) or -1 (for descending) at a"},
		{`{"a": {"$meta": "textScore"}}`, "sort by $meta or expressions is not supported at a"},
		{`{"$a": 1}`, `invalid sort key "$a"`},
		{`{"a..b": 1}`, `invalid sort key "a..b"`},
	}
	for _, tc := range cases {
		t.Run(tc.spec, func(t *testing.T) {
			_, err := CompileSort(bsontest.Doc(t, tc.spec))
			if err == nil || err.Error() != tc.want {
				t.Errorf("CompileSort(%s) error = %v, want %q", tc.spec, err, tc.want)
			}
		})
	}
}

// https://www.mongodb.com/docs/manual/tutorial/project-fields-from-query-results/
// https://www.mongodb.com/docs/manual/reference/operator/projection/slice/
// https://www.mongodb.com/docs/manual/reference/operator/projection/elemMatch/
func TestProject(t *testing.T) {
	journal := `{"_id": 1, "item": "journal", "status": "A", "size": {"h": 14, "w": 21, "uom": "cm"}, "instock": [{"warehouse": "A", "qty": 5}, {"warehouse": "C", "qty": 15}]}`
	cases := []struct {
		name, doc, proj, want string
	}{
		{"empty projection", journal, `{}`, journal},
		{"inclusion", journal, `{"item": 1, "status": 1}`, `{"_id": 1, "item": "journal", "status": "A"}`},
		{"inclusion order follows document", journal, `{"status": 1, "item": true}`, `{"_id": 1, "item": "journal", "status": "A"}`},
		{"inclusion without _id", journal, `{"item": 1, "status": 1, "_id": 0}`, `{"item": "journal", "status": "A"}`},
		{"exclusion", journal, `{"status": 0, "instock": 0}`, `{"_id": 1, "item": "journal", "size": {"h": 14, "w": 21, "uom": "cm"}}`},
		{"embedded inclusion", journal, `{"item": 1, "status": 1, "size.uom": 1}`, `{"_id": 1, "item": "journal", "status": "A", "size": {"uom": "cm"}}`},
		{"embedded exclusion", journal, `{"size.uom": 0}`, `{"_id": 1, "item": "journal", "status": "A", "size": {"h": 14, "w": 21}, "instock": [{"warehouse": "A", "qty": 5}, {"warehouse": "C", "qty": 15}]}`},
		{"array of documents inclusion", journal, `{"item": 1, "status": 1, "instock.qty": 1}`, `{"_id": 1, "item": "journal", "status": "A", "instock": [{"qty": 5}, {"qty": 15}]}`},
		{"slice last", journal, `{"item": 1, "status": 1, "instock": {"$slice": -1}}`, `{"_id": 1, "item": "journal", "status": "A", "instock": [{"warehouse": "C", "qty": 15}]}`},
		{"slice alone is exclusion style", `{"_id": 1, "a": [1, 2, 3], "b": 2}`, `{"a": {"$slice": 2}}`, `{"_id": 1, "a": [1, 2], "b": 2}`},
		{"slice skip limit", `{"_id": 1, "a": [1, 2, 3, 4]}`, `{"a": {"$slice": [1, 2]}}`, `{"_id": 1, "a": [2, 3]}`},
		{"slice negative skip", `{"_id": 1, "a": [1, 2, 3, 4]}`, `{"a": {"$slice": [-3, 1]}}`, `{"_id": 1, "a": [2]}`},
		{"slice non-array unchanged", `{"_id": 1, "a": 5}`, `{"a": {"$slice": 1}}`, `{"_id": 1, "a": 5}`},
		{"only _id", journal, `{"_id": 1}`, `{"_id": 1}`},
		{"exclude only _id", `{"_id": 1, "a": 1}`, `{"_id": 0}`, `{"a": 1}`},
		{"included field missing", `{"_id": 1, "a": 1}`, `{"b": 1}`, `{"_id": 1}`},
		{"dotted inclusion through scalar drops field", `{"_id": 1, "a": 5}`, `{"a.b": 1}`, `{"_id": 1}`},
		{"dotted inclusion keeps empty subdocument", `{"_id": 1, "a": {"c": 1}}`, `{"a.b": 1}`, `{"_id": 1, "a": {}}`},
		{"dotted inclusion drops scalars in arrays", `{"_id": 1, "a": [1, {"b": 2, "c": 3}, [{"b": 4}]]}`, `{"a.b": 1}`, `{"_id": 1, "a": [{"b": 2}, [{"b": 4}]]}`},
		{"dotted exclusion keeps scalars in arrays", `{"_id": 1, "a": [1, {"b": 2, "c": 3}]}`, `{"a.b": 0}`, `{"_id": 1, "a": [1, {"c": 3}]}`},
		{"elemMatch", `{"_id": 1, "zipcode": "63109", "students": [{"name": "john", "school": 102, "age": 10}, {"name": "jess", "school": 102, "age": 11}, {"name": "jeff", "school": 108, "age": 15}]}`, `{"students": {"$elemMatch": {"school": 102}}}`, `{"_id": 1, "students": [{"name": "john", "school": 102, "age": 10}]}`},
		{"elemMatch no match omits field", `{"_id": 1, "students": [{"school": 108}]}`, `{"students": {"$elemMatch": {"school": 102}}}`, `{"_id": 1}`},
		{"dotted _id inclusion", `{"_id": {"a": 1, "b": 2}, "x": 1}`, `{"_id.a": 1}`, `{"_id": {"a": 1}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Project(bsontest.Doc(t, tc.doc), bsontest.Doc(t, tc.proj))
			if err != nil {
				t.Fatal(err)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("invalid BSON output: %v", err)
			}
			if bsontest.JSON(got) != bsontest.JSON(bsontest.Doc(t, tc.want)) {
				t.Errorf("Project(%s, %s) =\n %s\nwant\n %s", tc.doc, tc.proj, bsontest.JSON(got), bsontest.JSON(bsontest.Doc(t, tc.want)))
			}
		})
	}
}

func TestProjectErrors(t *testing.T) {
	cases := []struct{ proj, want string }{
		{`{"a": 1, "b": 0}`, "cannot do exclusion on field b in inclusion projection"},
		{`{"a": 0, "b": 1}`, "cannot do inclusion on field b in exclusion projection"},
		{`{"a": 1, "a.b": 1}`, "path collision at a.b"},
		{`{"a.b": 1, "a": 1}`, "path collision at a"},
		{`{"a.$": 1}`, "positional projection is not supported at a.$"},
		{`{"a": "$b"}`, "unsupported projection value at a: aggregation expressions are not supported"},
		{`{"a": {"$slice": [1, 0]}}`, "$slice limit must be positive at a"},
		{`{"a.b": {"$elemMatch": {"x": 1}}}`, "cannot use $elemMatch projection on a nested field at a.b"},
		{`{"a": {"$meta": "textScore"}}`, "unsupported projection operator $meta at a"},
	}
	for _, tc := range cases {
		t.Run(tc.proj, func(t *testing.T) {
			_, err := Project(bsontest.Doc(t, `{"a": 1}`), bsontest.Doc(t, tc.proj))
			if err == nil || err.Error() != tc.want {
				t.Errorf("Project(%s) error = %v, want %q", tc.proj, err, tc.want)
			}
		})
	}
}

// FuzzSortProject checks that sorting and projecting arbitrary bytes never
// panics.
func FuzzSortProject(f *testing.F) {
	f.Add([]byte(bsontest.Doc(f, bsontest.ChangeEvent)))
	f.Add([]byte(bsontest.Doc(f, `{"a": [1, {"b": [2, {"c": 3}]}], "s": "x"}`)))
	sorts, _ := CompileSort(bsontest.Doc(f, `{"a.b": 1, "s": -1}`))
	proj, _ := CompileProjection(bsontest.Doc(f, `{"a.b": 1, "s": 1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		sorts.Compare(b, b)
		proj.Apply(b)
	})
}
