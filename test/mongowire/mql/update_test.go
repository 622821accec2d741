package mql

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/test/bsontest"
	"go.mongodb.org/mongo-driver/v2/bson"
)

var testNow = time.Date(2024, 1, 2, 3, 4, 5, 678000000, time.UTC)

func descJSON(d *UpdateDescription) string {
	return bsontest.JSON(bsontest.Marshal(bson.D{
		{Key: "updatedFields", Value: d.UpdatedFields},
		{Key: "removedFields", Value: d.RemovedFields},
		{Key: "truncatedArrays", Value: d.TruncatedArrays},
	}))
}

type updateCase struct {
	name   string
	doc    string
	update string
	insert bool
	want   string // resulting document
	desc   string // expected description as {u: updatedFields, r: removedFields, t: truncatedArrays}; "" to skip
}

func runUpdateCases(t *testing.T, cases []updateCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := bsontest.Doc(t, tc.doc)
			inCopy := append(bson.Raw(nil), in...)
			got, desc, err := ApplyUpdate(in, bsontest.Doc(t, tc.update), UpdateOptions{Insert: tc.insert, Now: testNow})
			if err != nil {
				t.Fatalf("ApplyUpdate: %v", err)
			}
			if string(in) != string(inCopy) {
				t.Fatal("input document was modified")
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("invalid output: %v", err)
			}
			if bsontest.JSON(got) != bsontest.JSON(bsontest.Doc(t, tc.want)) {
				t.Errorf("document\n got %s\nwant %s", bsontest.JSON(got), bsontest.JSON(bsontest.Doc(t, tc.want)))
			}
			if tc.desc != "" {
				w := bsontest.Doc(t, tc.desc)
				want := bsontest.JSON(bsontest.Marshal(bson.D{
					{Key: "updatedFields", Value: w.Lookup("u")},
					{Key: "removedFields", Value: w.Lookup("r")},
					{Key: "truncatedArrays", Value: w.Lookup("t")},
				}))
				if g := descJSON(desc); g != want {
					t.Errorf("description\n got %s\nwant %s", g, want)
				}
			}
			if (bsontest.JSON(got) == bsontest.JSON(in)) != desc.Empty() {
				t.Errorf("description empty = %v but document changed = %v", desc.Empty(), bsontest.JSON(got) != bsontest.JSON(in))
			}
		})
	}
}

const noChange = `{"u": {}, "r": [], "t": []}`

// https://www.mongodb.com/docs/manual/reference/operator/update/set/
// https://www.mongodb.com/docs/manual/reference/operator/update/unset/
// https://www.mongodb.com/docs/manual/reference/operator/update/setOnInsert/
// https://www.mongodb.com/docs/manual/reference/operator/update/currentDate/
func TestUpdateSetUnset(t *testing.T) {
	product := `{"_id": 100, "quantity": 250, "instock": true, "reorder": false, "details": {"model": "14QQ", "make": "Clothes Corp"}, "tags": ["apparel", "clothing"], "ratings": [{"by": "Customer007", "rating": 4}]}`
	runUpdateCases(t, []updateCase{
		{"set top-level fields", product,
			`{"$set": {"quantity": 500, "details": {"model": "2600", "make": "Fashionaires"}, "tags": ["coats", "outerwear", "clothing"]}}`,
			false,
			`{"_id": 100, "quantity": 500, "instock": true, "reorder": false, "details": {"model": "2600", "make": "Fashionaires"}, "tags": ["coats", "outerwear", "clothing"], "ratings": [{"by": "Customer007", "rating": 4}]}`,
			`{"u": {"details": {"model": "2600", "make": "Fashionaires"}, "quantity": 500, "tags": ["coats", "outerwear", "clothing"]}, "r": [], "t": []}`},
		{"set embedded field", product, `{"$set": {"details.make": "Kustom Kidz"}}`, false,
			`{"_id": 100, "quantity": 250, "instock": true, "reorder": false, "details": {"model": "14QQ", "make": "Kustom Kidz"}, "tags": ["apparel", "clothing"], "ratings": [{"by": "Customer007", "rating": 4}]}`,
			`{"u": {"details.make": "Kustom Kidz"}, "r": [], "t": []}`},
		{"set array elements", product, `{"$set": {"tags.1": "rain gear", "ratings.0.rating": 2}}`, false,
			`{"_id": 100, "quantity": 250, "instock": true, "reorder": false, "details": {"model": "14QQ", "make": "Clothes Corp"}, "tags": ["apparel", "rain gear"], "ratings": [{"by": "Customer007", "rating": 2}]}`,
			`{"u": {"ratings.0.rating": 2, "tags.1": "rain gear"}, "r": [], "t": []}`},
		{"set same value is no-op", product, `{"$set": {"quantity": 250, "details.model": "14QQ"}}`, false, product, noChange},
		{"set different numeric type is a change", `{"_id": 1, "a": 1}`, `{"$set": {"a": 1.0}}`, false, `{"_id": 1, "a": 1.0}`, `{"u": {"a": 1.0}, "r": [], "t": []}`},
		{"set creates intermediate documents", `{"_id": 1}`, `{"$set": {"a.b.c": 1}}`, false, `{"_id": 1, "a": {"b": {"c": 1}}}`, `{"u": {"a": {"b": {"c": 1}}}, "r": [], "t": []}`},
		{"set two fields under a created document", `{"_id": 1}`, `{"$set": {"a.c": 1, "a.b": 2}}`, false, `{"_id": 1, "a": {"b": 2, "c": 1}}`, `{"u": {"a": {"b": 2, "c": 1}}, "r": [], "t": []}`},
		{"new fields appended in lexicographic order", `{"_id": 1, "m": 0}`, `{"$set": {"z": 1, "b": 2, "a": 3}}`, false, `{"_id": 1, "m": 0, "a": 3, "b": 2, "z": 1}`, ""},
		{"set past array end pads with null", `{"_id": 1, "a": [1]}`, `{"$set": {"a.3": 4}}`, false, `{"_id": 1, "a": [1, null, null, 4]}`, `{"u": {"a": [1, null, null, 4]}, "r": [], "t": []}`},
		{"set array append index", `{"_id": 1, "a": [1]}`, `{"$set": {"a.1": 2}}`, false, `{"_id": 1, "a": [1, 2]}`, `{"u": {"a.1": 2}, "r": [], "t": []}`},
		{"set _id to same value", `{"_id": 1, "a": 1}`, `{"$set": {"_id": 1}}`, false, `{"_id": 1, "a": 1}`, noChange},
		{"unset", product, `{"$unset": {"quantity": "", "instock": ""}}`, false,
			`{"_id": 100, "reorder": false, "details": {"model": "14QQ", "make": "Clothes Corp"}, "tags": ["apparel", "clothing"], "ratings": [{"by": "Customer007", "rating": 4}]}`,
			`{"u": {}, "r": ["instock", "quantity"], "t": []}`},
		{"unset missing is no-op", product, `{"$unset": {"nothere": 1, "details.nothere": 1, "x.y": 1}}`, false, product, noChange},
		{"unset embedded", `{"_id": 1, "a": {"b": 1, "c": 2}}`, `{"$unset": {"a.b": true}}`, false, `{"_id": 1, "a": {"c": 2}}`, `{"u": {}, "r": ["a.b"], "t": []}`},
		{"unset array element sets null", `{"_id": 1, "a": [1, 2]}`, `{"$unset": {"a.0": ""}}`, false, `{"_id": 1, "a": [null, 2]}`, `{"u": {"a.0": null}, "r": [], "t": []}`},
		{"setOnInsert ignored on update", `{"_id": 1}`, `{"$set": {"item": "apple"}, "$setOnInsert": {"defaultQty": 100}}`, false, `{"_id": 1, "item": "apple"}`, ""},
		{"setOnInsert applied on insert", `{"_id": 1}`, `{"$set": {"item": "apple"}, "$setOnInsert": {"defaultQty": 100}}`, true, `{"_id": 1, "defaultQty": 100, "item": "apple"}`, ""},
		{"currentDate", `{"_id": 1, "status": "a", "lastModified": {"$date": "2013-10-02T01:11:18.965Z"}}`,
			`{"$currentDate": {"lastModified": true, "cancellation.date": {"$type": "timestamp"}}, "$set": {"cancellation.reason": "user request", "status": "D"}}`, false,
			`{"_id": 1, "status": "D", "lastModified": {"$date": "2024-01-02T03:04:05.678Z"}, "cancellation": {"date": {"$timestamp": {"t": 1704164645, "i": 1}}, "reason": "user request"}}`,
			`{"u": {"cancellation": {"date": {"$timestamp": {"t": 1704164645, "i": 1}}, "reason": "user request"}, "lastModified": {"$date": "2024-01-02T03:04:05.678Z"}, "status": "D"}, "r": [], "t": []}`},
		{"currentDate type date", `{"_id": 1}`, `{"$currentDate": {"d": {"$type": "date"}}}`, false, `{"_id": 1, "d": {"$date": "2024-01-02T03:04:05.678Z"}}`, ""},
		{"empty operand is no-op", `{"_id": 1}`, `{"$set": {}}`, false, `{"_id": 1}`, noChange},
		{"upsert into empty document", `{}`, `{"$set": {"a": 1}, "$setOnInsert": {"_id": 7}}`, true, `{"_id": 7, "a": 1}`, ""},
	})
}

// https://www.mongodb.com/docs/manual/reference/operator/update/inc/
// https://www.mongodb.com/docs/manual/reference/operator/update/mul/
// https://www.mongodb.com/docs/manual/reference/operator/update/min/
// https://www.mongodb.com/docs/manual/reference/operator/update/max/
// https://www.mongodb.com/docs/manual/reference/operator/update/rename/
func TestUpdateArithmeticAndRename(t *testing.T) {
	runUpdateCases(t, []updateCase{
		{"inc", `{"_id": 1, "sku": "abc123", "quantity": 10, "metrics": {"orders": 2, "ratings": 3.5}}`,
			`{"$inc": {"quantity": -2, "metrics.orders": 1}}`, false,
			`{"_id": 1, "sku": "abc123", "quantity": 8, "metrics": {"orders": 3, "ratings": 3.5}}`,
			`{"u": {"metrics.orders": 3, "quantity": 8}, "r": [], "t": []}`},
		{"inc missing field sets it", `{"_id": 1}`, `{"$inc": {"n": {"$numberLong": "5"}}}`, false, `{"_id": 1, "n": {"$numberLong": "5"}}`, ""},
		{"inc by zero is no-op", `{"_id": 1, "n": 5}`, `{"$inc": {"n": 0}}`, false, `{"_id": 1, "n": 5}`, noChange},
		{"inc int32 overflow promotes to int64", `{"_id": 1, "n": 2147483647}`, `{"$inc": {"n": 1}}`, false, `{"_id": 1, "n": {"$numberLong": "2147483648"}}`, ""},
		{"inc int with double gives double", `{"_id": 1, "n": 1}`, `{"$inc": {"n": 0.5}}`, false, `{"_id": 1, "n": 1.5}`, ""},
		{"inc decimal", `{"_id": 1, "n": {"$numberDecimal": "1.10"}}`, `{"$inc": {"n": 2}}`, false, `{"_id": 1, "n": {"$numberDecimal": "3.10"}}`, ""},
		{"mul", `{"_id": 1, "item": "Hats", "price": 10.99, "quantity": 25}`, `{"$mul": {"price": 1.25, "quantity": 2}}`, false,
			`{"_id": 1, "item": "Hats", "price": 13.7375, "quantity": 50}`, ""},
		{"mul missing field", `{"_id": 2, "item": "Unknown"}`, `{"$mul": {"price": {"$numberLong": "100"}}}`, false,
			`{"_id": 2, "item": "Unknown", "price": {"$numberLong": "0"}}`, ""},
		{"mul mixed types", `{"_id": 3, "item": "Scarf", "price": {"$numberLong": "10"}}`, `{"$mul": {"price": {"$numberInt": "5"}}}`, false,
			`{"_id": 3, "item": "Scarf", "price": {"$numberLong": "50"}}`, ""},
		{"min lowers", `{"_id": 1, "highScore": 800, "lowScore": 200}`, `{"$min": {"lowScore": 150}}`, false, `{"_id": 1, "highScore": 800, "lowScore": 150}`, `{"u": {"lowScore": 150}, "r": [], "t": []}`},
		{"min keeps", `{"_id": 1, "highScore": 800, "lowScore": 200}`, `{"$min": {"lowScore": 250}}`, false, `{"_id": 1, "highScore": 800, "lowScore": 200}`, noChange},
		{"max raises", `{"_id": 1, "highScore": 800, "lowScore": 200}`, `{"$max": {"highScore": 950}}`, false, `{"_id": 1, "highScore": 950, "lowScore": 200}`, ""},
		{"max keeps", `{"_id": 1, "highScore": 800, "lowScore": 200}`, `{"$max": {"highScore": 700}}`, false, `{"_id": 1, "highScore": 800, "lowScore": 200}`, noChange},
		{"max dates", `{"_id": 1, "d": {"$date": "2013-10-01T00:00:00Z"}}`, `{"$max": {"d": {"$date": "2014-10-01T00:00:00Z"}}}`, false, `{"_id": 1, "d": {"$date": "2014-10-01T00:00:00Z"}}`, ""},
		{"min across types uses sort order", `{"_id": 1, "v": "str"}`, `{"$min": {"v": 5}}`, false, `{"_id": 1, "v": 5}`, ""},
		{"rename", `{"_id": 1, "alias": ["The American Cincinnatus"], "mobile": "555-555-5555", "nmae": {"first": "george", "last": "washington"}}`,
			`{"$rename": {"nmae": "name"}}`, false,
			`{"_id": 1, "alias": ["The American Cincinnatus"], "mobile": "555-555-5555", "name": {"first": "george", "last": "washington"}}`,
			`{"u": {"name": {"first": "george", "last": "washington"}}, "r": ["nmae"], "t": []}`},
		{"rename embedded", `{"_id": 1, "name": {"first": "george", "last": "washington"}}`, `{"$rename": {"name.first": "name.fname"}}`, false,
			`{"_id": 1, "name": {"last": "washington", "fname": "george"}}`, ""},
		{"rename missing is no-op", `{"_id": 1, "a": 1}`, `{"$rename": {"wife": "spouse"}}`, false, `{"_id": 1, "a": 1}`, noChange},
		{"rename to a new subdocument", `{"_id": 1, "a": 1}`, `{"$rename": {"a": "b.c"}}`, false, `{"_id": 1, "b": {"c": 1}}`, ""},
	})
}

// https://www.mongodb.com/docs/manual/reference/operator/update/push/
// https://www.mongodb.com/docs/manual/reference/operator/update/each/
// https://www.mongodb.com/docs/manual/reference/operator/update/position/
// https://www.mongodb.com/docs/manual/reference/operator/update/slice/
// https://www.mongodb.com/docs/manual/reference/operator/update/sort/
// https://www.mongodb.com/docs/manual/reference/operator/update/addToSet/
// https://www.mongodb.com/docs/manual/reference/operator/update/pop/
// https://www.mongodb.com/docs/manual/reference/operator/update/pull/
// https://www.mongodb.com/docs/manual/reference/operator/update/pullAll/
func TestUpdateArrays(t *testing.T) {
	runUpdateCases(t, []updateCase{
		{"push", `{"_id": 1, "scores": [44, 78, 38, 80]}`, `{"$push": {"scores": 89}}`, false,
			`{"_id": 1, "scores": [44, 78, 38, 80, 89]}`, `{"u": {"scores.4": 89}, "r": [], "t": []}`},
		{"push each", `{"_id": 1, "scores": [44]}`, `{"$push": {"scores": {"$each": [90, 92, 85]}}}`, false,
			`{"_id": 1, "scores": [44, 90, 92, 85]}`, `{"u": {"scores.1": 90, "scores.2": 92, "scores.3": 85}, "r": [], "t": []}`},
		{"push creates array", `{"_id": 1}`, `{"$push": {"scores": 1}}`, false, `{"_id": 1, "scores": [1]}`, `{"u": {"scores": [1]}, "r": [], "t": []}`},
		{"push array value is one element", `{"_id": 1, "a": [1]}`, `{"$push": {"a": [2, 3]}}`, false, `{"_id": 1, "a": [1, [2, 3]]}`, ""},
		{"push position 0", `{"_id": 1, "scores": [100]}`, `{"$push": {"scores": {"$each": [50, 60, 70], "$position": 0}}}`, false,
			`{"_id": 1, "scores": [50, 60, 70, 100]}`, `{"u": {"scores": [50, 60, 70, 100]}, "r": [], "t": []}`},
		{"push position 2", `{"_id": 1, "scores": [50, 60, 70, 100]}`, `{"$push": {"scores": {"$each": [20, 30], "$position": 2}}}`, false,
			`{"_id": 1, "scores": [50, 60, 20, 30, 70, 100]}`, ""},
		{"push negative position", `{"_id": 1, "scores": [50, 60, 20, 30, 70, 100]}`, `{"$push": {"scores": {"$each": [90, 80], "$position": -2}}}`, false,
			`{"_id": 1, "scores": [50, 60, 20, 30, 90, 80, 70, 100]}`, ""},
		{"push slice last", `{"_id": 1, "scores": [40, 50, 60]}`, `{"$push": {"scores": {"$each": [80, 78, 86], "$slice": -5}}}`, false,
			`{"_id": 1, "scores": [50, 60, 80, 78, 86]}`, ""},
		{"push slice first", `{"_id": 2, "scores": [89, 90]}`, `{"$push": {"scores": {"$each": [100, 20], "$slice": 3}}}`, false,
			`{"_id": 2, "scores": [89, 90, 100]}`, `{"u": {"scores.2": 100}, "r": [], "t": []}`},
		{"push slice only", `{"_id": 3, "scores": [89, 70, 100, 20]}`, `{"$push": {"scores": {"$each": [], "$slice": -3}}}`, false,
			`{"_id": 3, "scores": [70, 100, 20]}`, ""},
		{"push slice truncates", `{"_id": 3, "scores": [89, 70, 100, 20]}`, `{"$push": {"scores": {"$each": [], "$slice": 2}}}`, false,
			`{"_id": 3, "scores": [89, 70]}`, `{"u": {}, "r": [], "t": [{"field": "scores", "newSize": 2}]}`},
		{"push sort embedded", `{"_id": 1, "quizzes": [{"id": 1, "score": 6}, {"id": 2, "score": 9}]}`,
			`{"$push": {"quizzes": {"$each": [{"id": 3, "score": 8}, {"id": 4, "score": 7}, {"id": 5, "score": 6}], "$sort": {"score": 1}}}}`, false,
			`{"_id": 1, "quizzes": [{"id": 1, "score": 6}, {"id": 5, "score": 6}, {"id": 4, "score": 7}, {"id": 3, "score": 8}, {"id": 2, "score": 9}]}`, ""},
		{"push sort values descending", `{"_id": 2, "tests": [89, 70, 89, 50]}`, `{"$push": {"tests": {"$each": [40, 60], "$sort": -1}}}`, false,
			`{"_id": 2, "tests": [89, 89, 70, 60, 50, 40]}`, ""},
		{"push sort slice", `{"_id": 5, "quizzes": [{"wk": 1, "score": 10}, {"wk": 2, "score": 8}, {"wk": 3, "score": 5}, {"wk": 4, "score": 6}]}`,
			`{"$push": {"quizzes": {"$each": [{"wk": 5, "score": 8}, {"wk": 6, "score": 7}, {"wk": 7, "score": 6}], "$sort": {"score": -1}, "$slice": 3}}}`, false,
			`{"_id": 5, "quizzes": [{"wk": 1, "score": 10}, {"wk": 2, "score": 8}, {"wk": 5, "score": 8}]}`, ""},
		{"addToSet array value", `{"_id": 1, "letters": ["a", "b"]}`, `{"$addToSet": {"letters": ["c", "d"]}}`, false,
			`{"_id": 1, "letters": ["a", "b", ["c", "d"]]}`, `{"u": {"letters.2": ["c", "d"]}, "r": [], "t": []}`},
		{"addToSet new", `{"_id": 1, "tags": ["electronics", "camera"]}`, `{"$addToSet": {"tags": "accessories"}}`, false,
			`{"_id": 1, "tags": ["electronics", "camera", "accessories"]}`, ""},
		{"addToSet existing", `{"_id": 1, "tags": ["electronics", "camera"]}`, `{"$addToSet": {"tags": "camera"}}`, false,
			`{"_id": 1, "tags": ["electronics", "camera"]}`, noChange},
		{"addToSet each", `{"_id": 2, "item": "cable", "tags": ["electronics", "supplies"]}`, `{"$addToSet": {"tags": {"$each": ["camera", "electronics", "accessories", "camera"]}}}`, false,
			`{"_id": 2, "item": "cable", "tags": ["electronics", "supplies", "camera", "accessories"]}`, ""},
		{"addToSet numeric equality", `{"_id": 1, "a": [1]}`, `{"$addToSet": {"a": 1.0}}`, false, `{"_id": 1, "a": [1]}`, noChange},
		{"addToSet creates", `{"_id": 1}`, `{"$addToSet": {"a": 1}}`, false, `{"_id": 1, "a": [1]}`, ""},
		{"pop first", `{"_id": 1, "scores": [8, 9, 10]}`, `{"$pop": {"scores": -1}}`, false, `{"_id": 1, "scores": [9, 10]}`, `{"u": {"scores": [9, 10]}, "r": [], "t": []}`},
		{"pop last", `{"_id": 10, "scores": [9, 10]}`, `{"$pop": {"scores": 1}}`, false, `{"_id": 10, "scores": [9]}`, `{"u": {}, "r": [], "t": [{"field": "scores", "newSize": 1}]}`},
		{"pop empty or missing", `{"_id": 1, "a": []}`, `{"$pop": {"a": 1, "b": -1}}`, false, `{"_id": 1, "a": []}`, noChange},
		{"pull values and conditions", `{"_id": 1, "fruits": ["apples", "pears", "oranges", "grapes", "bananas"], "vegetables": ["carrots", "celery", "squash", "carrots"]}`,
			`{"$pull": {"fruits": {"$in": ["apples", "oranges"]}, "vegetables": "carrots"}}`, false,
			`{"_id": 1, "fruits": ["pears", "grapes", "bananas"], "vegetables": ["celery", "squash"]}`,
			`{"u": {"fruits": ["pears", "grapes", "bananas"], "vegetables": ["celery", "squash"]}, "r": [], "t": []}`},
		{"pull condition", `{"_id": 1, "votes": [3, 5, 6, 7, 7, 8]}`, `{"$pull": {"votes": {"$gte": 6}}}`, false, `{"_id": 1, "votes": [3, 5]}`,
			`{"u": {}, "r": [], "t": [{"field": "votes", "newSize": 2}]}`},
		{"pull documents by query", `{"_id": 1, "results": [{"item": "A", "score": 5}, {"item": "B", "score": 8}]}`,
			`{"$pull": {"results": {"score": 8, "item": "B"}}}`, false, `{"_id": 1, "results": [{"item": "A", "score": 5}]}`, ""},
		{"pull documents with nested elemMatch", `{"_id": 1, "results": [{"item": "A", "answers": [{"q": 1, "a": 4}, {"q": 2, "a": 6}]}, {"item": "B", "answers": [{"q": 1, "a": 8}]}]}`,
			`{"$pull": {"results": {"answers": {"$elemMatch": {"q": 2, "a": {"$gte": 5}}}}}}`, false,
			`{"_id": 1, "results": [{"item": "B", "answers": [{"q": 1, "a": 8}]}]}`, ""},
		{"pull regex", `{"_id": 1, "a": ["apple", "banana", "avocado"]}`, `{"$pull": {"a": {"$regularExpression": {"pattern": "^a", "options": ""}}}}`, false, `{"_id": 1, "a": ["banana"]}`, ""},
		{"pull nothing", `{"_id": 1, "a": [1, 2]}`, `{"$pull": {"a": 3, "missing": 1}}`, false, `{"_id": 1, "a": [1, 2]}`, noChange},
		{"pullAll", `{"_id": 1, "scores": [0, 2, 5, 5, 1, 0]}`, `{"$pullAll": {"scores": [0, 5]}}`, false, `{"_id": 1, "scores": [2, 1]}`, ""},
	})
}

// https://www.mongodb.com/docs/manual/reference/method/db.collection.replaceOne/
func TestUpdateReplacement(t *testing.T) {
	runUpdateCases(t, []updateCase{
		{"replace keeps _id", `{"_id": 1, "a": 1, "b": 2}`, `{"c": 3, "a": 1}`, false, `{"_id": 1, "c": 3, "a": 1}`,
			`{"u": {"c": 3}, "r": ["b"], "t": []}`},
		{"replace with same _id", `{"_id": 1, "a": 1}`, `{"a": 2, "_id": 1}`, false, `{"a": 2, "_id": 1}`, ""},
		{"identical replacement", `{"_id": 1, "a": 1}`, `{"a": 1}`, false, `{"_id": 1, "a": 1}`, noChange},
		{"empty replacement", `{"_id": 1, "a": 1}`, `{}`, false, `{"_id": 1}`, `{"u": {}, "r": ["a"], "t": []}`},
	})
	if !IsReplacement(bsontest.Doc(t, `{"a": {"$set": 1}}`)) || IsReplacement(bsontest.Doc(t, `{"$set": {"a": 1}}`)) || !IsReplacement(nil) {
		t.Error("IsReplacement")
	}
}

func TestUpdateErrors(t *testing.T) {
	cases := []struct {
		doc, update string
		code        int
		want        string // prefix of the message
	}{
		{`{"_id": 1}`, `{"$set": {"_id": 2}}`, 66, "Performing an update on the path '_id' would modify the immutable field '_id'"},
		{`{"_id": {"a": 1}}`, `{"$set": {"_id.a": 2}}`, 66, "Performing an update on the path '_id' would modify the immutable field '_id'"},
		{`{"_id": 1}`, `{"$unset": {"_id": 1}}`, 66, "Performing an update on the path '_id' would modify the immutable field '_id'"},
		{`{"_id": 1}`, `{"_id": 2, "a": 1}`, 66, "After applying the update, the (immutable) field '_id' was found to have been altered to"},
		{`{"_id": 1}`, `{"$inc": {"a": "x"}}`, 14, "Cannot increment with non-numeric argument: {\"a\":\"x\"}"},
		{`{"_id": 1}`, `{"$mul": {"a": "x"}}`, 14, "Cannot multiply with non-numeric argument"},
		{`{"_id": 1, "a": "s"}`, `{"$inc": {"a": 1}}`, 14, "Cannot apply $inc to a value of non-numeric type. {\"_id\":1} has the field 'a' of non-numeric type string"},
		{`{"_id": 1, "a": {"$numberLong": "9223372036854775807"}}`, `{"$inc": {"a": 1}}`, 2, "Failed to apply $inc operations to current value"},
		{`{"_id": 1}`, `{"$set": {"a": 1}, "$inc": {"a": 1}}`, 40, "Updating the path 'a' would create a conflict at 'a'"},
		{`{"_id": 1}`, `{"$set": {"a.b": 1}, "$unset": {"a": 1}}`, 40, "Updating the path 'a' would create a conflict at 'a'"},
		{`{"_id": 1}`, `{"$set": {"a": 1, "a.b": 1}}`, 40, "Updating the path 'a.b' would create a conflict at 'a'"},
		{`{"_id": 1}`, `{"$set": {"a.b": 1}, "$rename": {"x": "a"}}`, 40, "Updating the path 'a' would create a conflict at 'a'"},
		{`{"_id": 1}`, `{"$foo": {"a": 1}}`, 9, "Unknown modifier: $foo. Expected a valid update modifier or pipeline-style update specified as an array"},
		{`{"_id": 1}`, `{"$set": {"a": 1}, "b": 2}`, 9, "Unknown modifier: b."},
		{`{"_id": 1}`, `{"$set": 1}`, 9, "Modifiers operate on fields but we found type int instead. For example: {$mod: {<field>: ...}} not {$set: 1}"},
		{`{"_id": 1}`, `{"$set": {"": 1}}`, 56, "An empty update path is not valid."},
		{`{"_id": 1}`, `{"$set": {"a..b": 1}}`, 56, "The update path 'a..b' contains an empty field name, which is not allowed."},
		{`{"_id": 1}`, `{"$set": {"a.$": 1}}`, 2, "The update path 'a.$' contains a positional or $-prefixed field name '$'"},
		{`{"_id": 1, "a": 1}`, `{"$set": {"a.b": 1}}`, 28, "Cannot create field 'b' in element {\"a\":1}"},
		{`{"_id": 1, "a": [1]}`, `{"$set": {"a.b": 1}}`, 28, "Cannot create field 'b' in element {\"a\":[1]}"},
		{`{"_id": 1, "a": 1}`, `{"$push": {"a": 1}}`, 2, "The field 'a' must be an array but is of type int in document {\"_id\":1}"},
		{`{"_id": 1, "a": 1}`, `{"$addToSet": {"a": 1}}`, 2, "Cannot apply $addToSet to non-array field. Field named 'a' has non-array type int"},
		{`{"_id": 1, "a": [1]}`, `{"$pop": {"a": 2}}`, 9, "$pop expects 1 or -1, found: 2"},
		{`{"_id": 1, "a": 5}`, `{"$pop": {"a": 1}}`, 14, "Path 'a' contains an element of non-array type 'int'"},
		{`{"_id": 1, "a": 5}`, `{"$pull": {"a": 1}}`, 2, "Cannot apply $pull to a non-array value"},
		{`{"_id": 1}`, `{"$pullAll": {"a": 1}}`, 2, "$pullAll requires an array argument but was given a int"},
		{`{"_id": 1}`, `{"$push": {"a": {"$each": 1}}}`, 2, "The argument to $each in $push must be an array but it was of type: int"},
		{`{"_id": 1}`, `{"$push": {"a": {"$each": [1], "$bad": 1}}}`, 2, "Unrecognized clause in $push: $bad"},
		{`{"_id": 1}`, `{"$rename": {"a": "a"}}`, 2, "The source and target field for $rename must differ"},
		{`{"_id": 1}`, `{"$rename": {"a": "a.b"}}`, 2, "The source and target field for $rename must not be on the same path"},
		{`{"_id": 1}`, `{"$rename": {"a": 1}}`, 2, "The 'to' field for $rename must be a string"},
		{`{"_id": 1, "a": [{"b": 1}]}`, `{"$rename": {"a.0.b": "c"}}`, 2, "The source field cannot be an array element"},
		{`{"_id": 1}`, `{"$currentDate": {"a": {"$type": "bogus"}}}`, 2, "object is not valid type for $currentDate"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			_, _, err := ApplyUpdate(bsontest.Doc(t, tc.doc), bsontest.Doc(t, tc.update), UpdateOptions{})
			var qe *Error
			if !errors.As(err, &qe) {
				t.Fatalf("ApplyUpdate(%s, %s) error = %v, want *Error", tc.doc, tc.update, err)
			}
			if qe.Code != tc.code || !strings.HasPrefix(qe.Message, tc.want) {
				t.Errorf("error = %d %q, want %d %q...", qe.Code, qe.Message, tc.code, tc.want)
			}
		})
	}
}

// https://www.mongodb.com/docs/manual/reference/method/db.collection.update/#upsert-behavior
func TestUpsertSeed(t *testing.T) {
	cases := []struct{ filter, want, err string }{
		{`{"name": "Andy", "rating": {"$gt": 1}}`, `{"name": "Andy"}`, ""},
		{`{"_id": 5, "a.b": 1, "a.c": {"$eq": 2}}`, `{"_id": 5, "a": {"b": 1, "c": 2}}`, ""},
		{`{"$and": [{"x": 1}, {"y": {"$in": [2]}}], "z": {"$in": [1, 2]}}`, `{"x": 1, "y": 2}`, ""},
		{`{"$or": [{"x": 1}]}`, `{"x": 1}`, ""},
		{`{"$or": [{"x": 1}, {"y": 2}]}`, `{}`, ""},
		{`{"doc": {"p": 1, "q": [1, 2]}, "s": {"$regularExpression": {"pattern": "^a", "options": ""}}}`, `{"doc": {"p": 1, "q": [1, 2]}}`, ""},
		{`{"a": 1, "$and": [{"a": 2}]}`, "", "cannot infer query fields to set, path 'a' is matched twice"},
		{`{"a": 1, "a.b": 2}`, "", "cannot infer query fields to set, both paths 'a' and 'a.b' are matched"},
		{`{"a": {"$bad": 1}}`, "", "unknown operator $bad at a"},
	}
	for _, tc := range cases {
		t.Run(tc.filter, func(t *testing.T) {
			got, err := UpsertSeed(bsontest.Doc(t, tc.filter))
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if bsontest.JSON(bsontest.Marshal(got)) != bsontest.JSON(bsontest.Doc(t, tc.want)) {
				t.Errorf("seed = %s, want %s", bsontest.JSON(bsontest.Marshal(got)), bsontest.JSON(bsontest.Doc(t, tc.want)))
			}
		})
	}
}

// An upsert as the test server performs it: seed from the filter, then
// apply the update as an insert.
func TestUpsertFlow(t *testing.T) {
	seed, err := UpsertSeed(bsontest.Doc(t, `{"item": "apple", "qty": {"$gt": 1}}`))
	if err != nil {
		t.Fatal(err)
	}
	seed = append(bson.D{{Key: "_id", Value: 1}}, seed...)
	got, _, err := ApplyUpdate(bsontest.Marshal(seed), bsontest.Doc(t, `{"$set": {"status": "A"}, "$setOnInsert": {"defaultQty": 100}}`), UpdateOptions{Insert: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"_id": 1, "item": "apple", "defaultQty": 100, "status": "A"}`; bsontest.JSON(got) != bsontest.JSON(bsontest.Doc(t, want)) {
		t.Errorf("got %s, want %s", bsontest.JSON(got), want)
	}
}

func BenchmarkApplyUpdate(b *testing.B) {
	d := bsontest.Doc(b, bsontest.ChangeEvent)
	full := d.Lookup("fullDocument").Document()
	upd := bsontest.Doc(b, `{"$set": {"status": "shipped", "shipping.carrier": "dhl"}, "$inc": {"customer.orders": 1}, "$push": {"items": {"sku": "C-3", "qty": 1}}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ApplyUpdate(full, upd, UpdateOptions{Now: testNow}); err != nil {
			b.Fatal(err)
		}
	}
}
