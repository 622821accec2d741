package query

import (
	"strings"
	"sync"
	"testing"

	"github.com/changegate/changegate/test/bsontest"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// collection is a set of documents from a MongoDB documentation page; key
// names the field whose value identifies a document in expectations.
type collection struct {
	key  string
	docs []string
}

type collCase struct {
	filter string
	want   string // space-separated key values of matching documents
}

func runCollection(t *testing.T, c collection, cases []collCase) {
	t.Helper()
	docs := make([]bson.Raw, len(c.docs))
	for i, s := range c.docs {
		docs[i] = bsontest.Doc(t, s)
	}
	for _, tc := range cases {
		t.Run(tc.filter, func(t *testing.T) {
			f, err := Compile(bsontest.Doc(t, tc.filter))
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			var got []string
			for _, d := range docs {
				if f.Match(d) {
					got = append(got, bsontest.FieldString(t, d, c.key))
				}
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Errorf("matched [%s], want [%s]", g, tc.want)
			}
		})
	}
}

// https://www.mongodb.com/docs/manual/tutorial/query-documents/
// https://www.mongodb.com/docs/manual/tutorial/query-embedded-documents/
func TestMatchQueryDocuments(t *testing.T) {
	inventory := collection{key: "item", docs: []string{
		`{"item": "journal", "qty": 25, "size": {"h": 14, "w": 21, "uom": "cm"}, "status": "A"}`,
		`{"item": "notebook", "qty": 50, "size": {"h": 8.5, "w": 11, "uom": "in"}, "status": "A"}`,
		`{"item": "paper", "qty": 100, "size": {"h": 8.5, "w": 11, "uom": "in"}, "status": "D"}`,
		`{"item": "planner", "qty": 75, "size": {"h": 22.85, "w": 30, "uom": "cm"}, "status": "D"}`,
		`{"item": "postcard", "qty": 45, "size": {"h": 10, "w": 15.25, "uom": "cm"}, "status": "A"}`,
	}}
	runCollection(t, inventory, []collCase{
		{`{}`, "journal notebook paper planner postcard"},
		{`{"status": "D"}`, "paper planner"},
		{`{"status": {"$in": ["A", "D"]}}`, "journal notebook paper planner postcard"},
		{`{"status": "A", "qty": {"$lt": 30}}`, "journal"},
		{`{"$or": [{"status": "A"}, {"qty": {"$lt": 30}}]}`, "journal notebook postcard"},
		{`{"status": "A", "$or": [{"qty": {"$lt": 30}}, {"item": {"$regularExpression": {"pattern": "^p", "options": ""}}}]}`, "journal postcard"},
		{`{"size": {"h": 14, "w": 21, "uom": "cm"}}`, "journal"},
		// Field order matters for embedded document equality.
		{`{"size": {"w": 21, "h": 14, "uom": "cm"}}`, ""},
		{`{"size.uom": "in"}`, "notebook paper"},
		{`{"size.h": {"$lt": 15}}`, "journal notebook paper postcard"},
		{`{"size.h": {"$lt": 15}, "size.uom": "in", "status": "D"}`, "paper"},
		{`{"size": {"h": 14, "w": 21}}`, ""},
		// Numeric equality across types inside embedded documents.
		{`{"size": {"h": 14.0, "w": {"$numberLong": "21"}, "uom": "cm"}}`, "journal"},
		{`{"$and": [{"status": "A"}, {"qty": {"$gte": 45}}]}`, "notebook postcard"},
	})
}

// https://www.mongodb.com/docs/manual/tutorial/query-arrays/
func TestMatchQueryArrays(t *testing.T) {
	inventory := collection{key: "item", docs: []string{
		`{"item": "journal", "qty": 25, "tags": ["blank", "red"], "dim_cm": [14, 21]}`,
		`{"item": "notebook", "qty": 50, "tags": ["red", "blank"], "dim_cm": [14, 21]}`,
		`{"item": "paper", "qty": 100, "tags": ["red", "blank", "plain"], "dim_cm": [14, 21]}`,
		`{"item": "planner", "qty": 75, "tags": ["blank", "red"], "dim_cm": [22.85, 30]}`,
		`{"item": "postcard", "qty": 45, "tags": ["blue"], "dim_cm": [10, 15.25]}`,
	}}
	runCollection(t, inventory, []collCase{
		{`{"tags": ["red", "blank"]}`, "notebook"},
		{`{"tags": {"$all": ["red", "blank"]}}`, "journal notebook paper planner"},
		{`{"tags": "red"}`, "journal notebook paper planner"},
		{`{"dim_cm": {"$gt": 25}}`, "planner"},
		// Different elements may satisfy different conditions.
		{`{"dim_cm": {"$gt": 15, "$lt": 20}}`, "journal notebook paper postcard"},
		{`{"dim_cm": {"$elemMatch": {"$gt": 22, "$lt": 30}}}`, "planner"},
		{`{"dim_cm.1": {"$gt": 25}}`, "planner"},
		{`{"tags": {"$size": 3}}`, "paper"},
		{`{"tags": {"$size": 1}}`, "postcard"},
		{`{"tags.0": "red"}`, "notebook paper"},
		{`{"tags": {"$in": ["blue", "plain"]}}`, "paper postcard"},
		{`{"tags": {"$nin": ["blue", "plain"]}}`, "journal notebook planner"},
		{`{"tags": {"$ne": "red"}}`, "postcard"},
		{`{"dim_cm": [14, 21]}`, "journal notebook paper"},
		{`{"dim_cm": [21, 14]}`, ""},
		{`{"dim_cm": {"$gt": [14, 20]}}`, "journal notebook paper planner"},
	})
}

// https://www.mongodb.com/docs/manual/tutorial/query-array-of-documents/
func TestMatchArrayOfDocuments(t *testing.T) {
	inventory := collection{key: "item", docs: []string{
		`{"item": "journal", "instock": [{"warehouse": "A", "qty": 5}, {"warehouse": "C", "qty": 15}]}`,
		`{"item": "notebook", "instock": [{"warehouse": "C", "qty": 5}]}`,
		`{"item": "paper", "instock": [{"warehouse": "A", "qty": 60}, {"warehouse": "B", "qty": 15}]}`,
		`{"item": "planner", "instock": [{"warehouse": "A", "qty": 40}, {"warehouse": "B", "qty": 5}]}`,
		`{"item": "postcard", "instock": [{"warehouse": "B", "qty": 15}, {"warehouse": "C", "qty": 35}]}`,
	}}
	runCollection(t, inventory, []collCase{
		{`{"instock": {"warehouse": "A", "qty": 5}}`, "journal"},
		{`{"instock": {"qty": 5, "warehouse": "A"}}`, ""},
		{`{"instock.0.qty": {"$lte": 20}}`, "journal notebook postcard"},
		{`{"instock.qty": {"$lte": 20}}`, "journal notebook paper planner postcard"},
		{`{"instock": {"$elemMatch": {"qty": 5, "warehouse": "A"}}}`, "journal"},
		{`{"instock": {"$elemMatch": {"qty": {"$gt": 10, "$lte": 20}}}}`, "journal paper postcard"},
		{`{"instock.qty": {"$gt": 10, "$lte": 20}}`, "journal paper planner postcard"},
		{`{"instock.qty": 5, "instock.warehouse": "A"}`, "journal planner"},
		{`{"instock.warehouse": {"$size": 2}}`, ""},
		{`{"instock": {"$size": 1}}`, "notebook"},
		{`{"instock.1.warehouse": {"$exists": false}}`, "notebook"},
		{`{"instock.qty": {"$all": [5, 15]}}`, "journal"},
	})
}

// https://www.mongodb.com/docs/manual/tutorial/query-for-null-fields/
// https://www.mongodb.com/docs/manual/reference/operator/query/exists/
func TestMatchNullAndMissing(t *testing.T) {
	inventory := collection{key: "_id", docs: []string{
		`{"_id": 1, "item": null}`,
		`{"_id": 2}`,
	}}
	runCollection(t, inventory, []collCase{
		{`{"item": null}`, "1 2"},
		{`{"item": {"$eq": null}}`, "1 2"},
		{`{"item": {"$ne": null}}`, ""},
		{`{"item": {"$type": 10}}`, "1"},
		{`{"item": {"$type": "null"}}`, "1"},
		{`{"item": {"$exists": false}}`, "2"},
		{`{"item": {"$exists": true}}`, "1"},
		{`{"item": {"$in": [null]}}`, "1 2"},
		{`{"item": {"$nin": [null]}}`, ""},
		{`{"item": {"$gte": null}}`, "1 2"},
		{`{"item": {"$lt": null}}`, ""},
	})
	spices := collection{key: "_id", docs: []string{
		`{"_id": 1, "saffron": 5, "cinnamon": 5, "mustard": null}`,
		`{"_id": 2, "saffron": 3, "cinnamon": null, "mustard": 8}`,
		`{"_id": 3, "saffron": null, "cinnamon": 3, "mustard": 9}`,
		`{"_id": 4, "saffron": 1, "cinnamon": 2, "mustard": 3}`,
		`{"_id": 5, "saffron": 2, "mustard": 5}`,
		`{"_id": 6, "saffron": 3, "cinnamon": 2}`,
		`{"_id": 7, "saffron": 4}`,
		`{"_id": 8, "cinnamon": 2, "mustard": 4}`,
		`{"_id": 9, "cinnamon": 2}`,
		`{"_id": 10, "mustard": 6}`,
	}}
	runCollection(t, spices, []collCase{
		{`{"saffron": {"$exists": true}}`, "1 2 3 4 5 6 7"},
		{`{"cinnamon": {"$exists": false}}`, "5 7 10"},
		{`{"cinnamon": {"$exists": 0}}`, "5 7 10"},
		{`{"mustard": {"$exists": true, "$nin": [5, 15]}}`, "1 2 3 4 8 10"},
	})
	// SERVER-36681 (MongoDB 8.0): dotted-path null queries also match
	// empty arrays and arrays of scalars; jstests/core/query/null_query_semantics.js.
	nulls := collection{key: "_id", docs: []string{
		`{"_id": "a_empty_subobject", "a": {}}`,
		`{"_id": "a_null", "a": null}`,
		`{"_id": "a_number", "a": 4}`,
		`{"_id": "a_subobject_b_not_null", "a": {"b": "hi"}}`,
		`{"_id": "a_subobject_b_null", "a": {"b": null}}`,
		`{"_id": "no_a"}`,
		`{"_id": "a_empty_array", "a": []}`,
		`{"_id": "a_object_array_no_b_nulls", "a": [{"b": 1}, {"b": 3}, {"b": "string"}]}`,
		`{"_id": "a_object_array_some_b_nulls", "a": [{"b": null}, {"b": 3}, {"b": null}]}`,
		`{"_id": "a_object_array_some_b_missing", "a": [{"b": 3}, {}]}`,
		`{"_id": "a_value_array_all_nulls", "a": [null, null]}`,
		`{"_id": "a_value_array_no_nulls", "a": [1, "string", 4]}`,
	}}
	runCollection(t, nulls, []collCase{
		{`{"a": {"$eq": null}}`, "a_null no_a a_value_array_all_nulls"},
		{`{"a": {"$ne": null}}`, "a_empty_subobject a_number a_subobject_b_not_null a_subobject_b_null a_empty_array a_object_array_no_b_nulls a_object_array_some_b_nulls a_object_array_some_b_missing a_value_array_no_nulls"},
		{`{"a": {"$in": [null, 4]}}`, "a_null a_number no_a a_value_array_all_nulls a_value_array_no_nulls"},
		{`{"a.b": {"$eq": null}}`, "a_empty_subobject a_null a_number a_subobject_b_null no_a a_empty_array a_object_array_some_b_nulls a_object_array_some_b_missing a_value_array_all_nulls a_value_array_no_nulls"},
		{`{"a.b": {"$ne": null}}`, "a_subobject_b_not_null a_object_array_no_b_nulls"},
		{`{"a.b": {"$exists": false}}`, "a_empty_subobject a_null a_number no_a a_empty_array a_value_array_all_nulls a_value_array_no_nulls"},
		{`{"a": {"$elemMatch": {"$eq": null}}}`, "a_value_array_all_nulls"},
		{`{"a": {"$elemMatch": {"b": {"$eq": null}}}}`, "a_object_array_some_b_nulls a_object_array_some_b_missing"},
	})
}

// https://www.mongodb.com/docs/manual/reference/operator/query/eq/
// https://www.mongodb.com/docs/manual/reference/operator/query/ne/
func TestMatchEqNe(t *testing.T) {
	inventory := collection{key: "item", docs: []string{
		`{"item": "nuts", "quantity": 30, "carrier": {"name": "Shipit", "fee": 3}}`,
		`{"item": "bolts", "quantity": 50, "carrier": {"name": "Shipit", "fee": 4}}`,
		`{"item": "washers", "quantity": 10, "carrier": {"name": "Shipit", "fee": 1}}`,
		`{"item": "screws"}`,
	}}
	runCollection(t, inventory, []collCase{
		{`{"quantity": {"$ne": 20}}`, "nuts bolts washers screws"},
		{`{"carrier.fee": {"$ne": 1}}`, "nuts bolts screws"},
		{`{"quantity": {"$eq": 30}}`, "nuts"},
		{`{"carrier.name": {"$eq": "Shipit"}}`, "nuts bolts washers"},
		{`{"carrier": {"$eq": {"name": "Shipit", "fee": 4}}}`, "bolts"},
		{`{"quantity": 30.0}`, "nuts"},
		{`{"quantity": {"$numberDecimal": "30.00"}}`, "nuts"},
		{`{"quantity": "30"}`, ""},
	})
	// $eq with a regex operand matches only an equal regex value, while
	// implicit equality with a regex is a pattern match.
	companies := collection{key: "_id", docs: []string{
		`{"_id": 1, "company": "MongoDB"}`,
		`{"_id": 2, "company": "MongoDB2"}`,
		`{"_id": 3, "company": {"$regularExpression": {"pattern": "MongoDB", "options": ""}}}`,
	}}
	runCollection(t, companies, []collCase{
		{`{"company": "MongoDB"}`, "1"},
		{`{"company": {"$eq": {"$regularExpression": {"pattern": "MongoDB", "options": ""}}}}`, "3"},
		{`{"company": {"$regularExpression": {"pattern": "MongoDB", "options": ""}}}`, "1 2 3"},
		{`{"company": {"$regex": "MongoDB"}}`, "1 2 3"},
		{`{"company": {"$in": [{"$regularExpression": {"pattern": "DB2$", "options": ""}}]}}`, "2"},
	})
}

// https://www.mongodb.com/docs/manual/reference/operator/query/gt/ and
// https://www.mongodb.com/docs/manual/reference/method/db.collection.find/#query-for-ranges
// Comparison operators only match values of the operand's type bracket.
func TestMatchComparison(t *testing.T) {
	c := collection{key: "_id", docs: []string{
		`{"_id": 1, "qty": 15}`,
		`{"_id": 2, "qty": 20.5}`,
		`{"_id": 3, "qty": {"$numberLong": "25"}}`,
		`{"_id": 4, "qty": "30"}`,
		`{"_id": 5, "qty": null}`,
		`{"_id": 6}`,
		`{"_id": 7, "qty": {"$numberDecimal": "20.5"}}`,
		`{"_id": 8, "qty": [10, 40]}`,
		`{"_id": 9, "qty": {"$date": "2024-01-02T00:00:00Z"}}`,
		`{"_id": 10, "qty": {"$numberDouble": "NaN"}}`,
		`{"_id": 11, "qty": true}`,
	}}
	runCollection(t, c, []collCase{
		{`{"qty": {"$gt": 20}}`, "2 3 7 8"},
		{`{"qty": {"$gte": 20.5}}`, "2 3 7 8"},
		{`{"qty": {"$lt": 20.5}}`, "1 8"},
		{`{"qty": {"$lte": {"$numberDecimal": "20.5"}}}`, "1 2 7 8"},
		{`{"qty": {"$gt": "0"}}`, "4"},
		{`{"qty": {"$gt": 20, "$lt": 21}}`, "2 7 8"},
		{`{"qty": {"$elemMatch": {"$gt": 20, "$lt": 21}}}`, ""},
		{`{"qty": {"$gt": {"$date": "2024-01-01T00:00:00Z"}}}`, "9"},
		{`{"qty": {"$gt": {"$minKey": 1}}}`, "1 2 3 4 5 6 7 8 9 10 11"},
		{`{"qty": {"$lt": {"$maxKey": 1}}}`, "1 2 3 4 5 6 7 8 9 10 11"},
		{`{"qty": {"$numberDouble": "NaN"}}`, "10"},
		{`{"qty": {"$gte": {"$numberDouble": "NaN"}}}`, "10"},
		{`{"qty": {"$gt": {"$numberDouble": "NaN"}}}`, ""},
		{`{"qty": {"$lt": 100}}`, "1 2 3 7 8"},
		{`{"qty": {"$gt": {"$numberDouble": "-Infinity"}}}`, "1 2 3 7 8"},
		{`{"qty": {"$gte": false}}`, "11"},
		{`{"qty": {"$not": {"$gt": 20}}}`, "1 4 5 6 9 10 11"},
		{`{"qty": {"$not": {"$gt": 20, "$lt": 30}}}`, "1 4 5 6 9 10 11"},
	})
}

// https://www.mongodb.com/docs/manual/reference/operator/query/in/
// https://www.mongodb.com/docs/manual/reference/operator/query/nin/
func TestMatchInNin(t *testing.T) {
	inventory := collection{key: "item", docs: []string{
		`{"item": "Pens", "quantity": 350, "tags": ["school", "office"]}`,
		`{"item": "Erasers", "quantity": 15, "tags": ["school", "home"]}`,
		`{"item": "Maps", "tags": ["office", "storage"]}`,
		`{"item": "Books", "quantity": 5, "tags": ["school", "storage", "home"]}`,
	}}
	runCollection(t, inventory, []collCase{
		{`{"quantity": {"$in": [5, 15]}}`, "Erasers Books"},
		{`{"quantity": {"$in": [5.0, {"$numberLong": "15"}]}}`, "Erasers Books"},
		{`{"tags": {"$in": ["home", "school"]}}`, "Pens Erasers Books"},
		{`{"tags": {"$in": [{"$regularExpression": {"pattern": "^be", "options": ""}}, {"$regularExpression": {"pattern": "^st", "options": ""}}]}}`, "Maps Books"},
		{`{"quantity": {"$nin": [5, 15]}}`, "Pens Maps"},
		{`{"tags": {"$nin": ["school"]}}`, "Maps"},
		{`{"quantity": {"$in": []}}`, ""},
		{`{"quantity": {"$nin": []}}`, "Pens Erasers Maps Books"},
		{`{"tags": {"$in": [["school", "home"]]}}`, "Erasers"},
		{`{"quantity": {"$in": [null, 5]}}`, "Maps Books"},
	})
}

// https://www.mongodb.com/docs/manual/reference/operator/query/type/
func TestMatchType(t *testing.T) {
	addressBook := collection{key: "_id", docs: []string{
		`{"_id": 1, "address": "2030 Martian Way", "zipCode": "90698345"}`,
		`{"_id": 2, "address": "156 Lunar Place", "zipCode": 43339374.0}`,
		`{"_id": 3, "address": "2324 Pluto Place", "zipCode": {"$numberLong": "3921412"}}`,
		`{"_id": 4, "address": "55 Saturn Ring", "zipCode": {"$numberInt": "88602117"}}`,
		`{"_id": 5, "address": "104 Venus Drive", "zipCode": ["834847278", "1893289032"]}`,
		`{"_id": 6, "address": "none"}`,
		`{"_id": 7, "zipCode": []}`,
		`{"_id": 8, "zipCode": {"$numberDecimal": "1.5"}}`,
	}}
	runCollection(t, addressBook, []collCase{
		{`{"zipCode": {"$type": 2}}`, "1 5"},
		{`{"zipCode": {"$type": "string"}}`, "1 5"},
		{`{"zipCode": {"$type": 1}}`, "2"},
		{`{"zipCode": {"$type": "double"}}`, "2"},
		{`{"zipCode": {"$type": "number"}}`, "2 3 4 8"},
		{`{"zipCode": {"$type": ["string", "long"]}}`, "1 3 5"},
		{`{"zipCode": {"$type": "array"}}`, "5 7"},
		{`{"zipCode": {"$type": 4}}`, "5 7"},
		{`{"zipCode": {"$type": "int"}}`, "4"},
		{`{"zipCode": {"$type": "decimal"}}`, "8"},
		{`{"zipCode": {"$not": {"$type": "string"}}}`, "2 3 4 6 7 8"},
	})
}

// https://www.mongodb.com/docs/manual/reference/operator/query/mod/
func TestMatchMod(t *testing.T) {
	inventory := collection{key: "_id", docs: []string{
		`{"_id": 1, "item": "abc123", "qty": 0}`,
		`{"_id": 2, "item": "xyz123", "qty": 5}`,
		`{"_id": 3, "item": "ijk123", "qty": 12}`,
		`{"_id": 4, "item": "neg", "qty": -12}`,
		`{"_id": 5, "item": "dbl", "qty": 12.9}`,
		`{"_id": 6, "item": "str", "qty": "12"}`,
	}}
	runCollection(t, inventory, []collCase{
		{`{"qty": {"$mod": [4, 0]}}`, "1 3 4 5"},
		{`{"qty": {"$mod": [4.0, 0]}}`, "1 3 4 5"},
		{`{"qty": {"$mod": [4.5, 0]}}`, "1 3 4 5"},
		{`{"qty": {"$mod": [4, 1]}}`, "2"},
		{`{"qty": {"$mod": [-4, 0]}}`, "1 3 4 5"},
		{`{"qty": {"$mod": [5, -2]}}`, "4"},
	})
}

// https://www.mongodb.com/docs/manual/reference/operator/query/regex/
func TestMatchRegex(t *testing.T) {
	products := collection{key: "_id", docs: []string{
		`{"_id": 100, "sku": "abc123", "description": "Single line description."}`,
		`{"_id": 101, "sku": "abc789", "description": "First line\nSecond line"}`,
		`{"_id": 102, "sku": "xyz456", "description": "Many spaces before     line"}`,
		`{"_id": 103, "sku": "xyz789", "description": "Multiple\nline description"}`,
		`{"_id": 104, "sku": "Abc789", "description": "SKU should match case insensitive"}`,
	}}
	runCollection(t, products, []collCase{
		{`{"sku": {"$regex": "789$"}}`, "101 103 104"},
		{`{"sku": {"$regex": {"$regularExpression": {"pattern": "789$", "options": ""}}}}`, "101 103 104"},
		{`{"sku": {"$regex": "^ABC", "$options": "i"}}`, "100 101 104"},
		{`{"sku": {"$options": "i", "$regex": "^ABC"}}`, "100 101 104"},
		{`{"sku": {"$regularExpression": {"pattern": "^ABC", "options": "i"}}}`, "100 101 104"},
		{`{"description": {"$regex": "^S", "$options": "m"}}`, "100 101 104"},
		{`{"description": {"$regex": "^S"}}`, "100 104"},
		{`{"description": {"$regex": "m.*line", "$options": "si"}}`, "102 103"},
		{`{"description": {"$regex": "m.*line", "$options": "i"}}`, "102"},
		{`{"sku": {"$regex": "abc #category code\n123 #item number", "$options": "x"}}`, "100"},
		{`{"sku": {"$not": {"$regularExpression": {"pattern": "^abc", "options": ""}}}}`, "102 103 104"},
		{`{"sku": {"$in": [{"$regularExpression": {"pattern": "^abc", "options": ""}}, "xyz456"]}}`, "100 101 102"},
		{`{"sku": {"$nin": [{"$regularExpression": {"pattern": "^abc", "options": "i"}}]}}`, "102 103"},
		{`{"_id": {"$regex": "10"}}`, ""},
	})
}

// https://www.mongodb.com/docs/manual/reference/operator/query/all/
func TestMatchAll(t *testing.T) {
	inventory := collection{key: "code", docs: []string{
		`{"code": "xyz", "tags": ["school", "book", "bag", "headphone", "appliance"], "qty": [{"size": "S", "num": 10, "color": "blue"}, {"size": "M", "num": 45, "color": "blue"}, {"size": "L", "num": 100, "color": "green"}]}`,
		`{"code": "abc", "tags": ["appliance", "school", "book"], "qty": [{"size": "6", "num": 100, "color": "green"}, {"size": "6", "num": 50, "color": "blue"}, {"size": "8", "num": 100, "color": "brown"}]}`,
		`{"code": "efg", "tags": ["school", "book"], "qty": [{"size": "S", "num": 10, "color": "blue"}, {"size": "M", "num": 100, "color": "blue"}, {"size": "L", "num": 100, "color": "green"}]}`,
		`{"code": "ijk", "tags": ["electronics", "school"], "qty": [{"size": "M", "num": 100, "color": "green"}]}`,
		`{"code": "scalar", "tags": "school"}`,
	}}
	runCollection(t, inventory, []collCase{
		{`{"tags": {"$all": ["appliance", "school", "book"]}}`, "xyz abc"},
		{`{"qty": {"$all": [{"$elemMatch": {"size": "M", "num": {"$gt": 50}}}, {"$elemMatch": {"num": 100, "color": "green"}}]}}`, "efg ijk"},
		{`{"qty.num": {"$all": [50]}}`, "abc"},
		{`{"qty.num": 50}`, "abc"},
		{`{"tags": {"$all": ["school"]}}`, "xyz abc efg ijk scalar"},
		{`{"tags": {"$all": []}}`, ""},
		{`{"tags": {"$all": [["school", "book"]]}}`, "efg"},
	})
}

// https://www.mongodb.com/docs/manual/reference/operator/query/elemMatch/
func TestMatchElemMatch(t *testing.T) {
	scores := collection{key: "_id", docs: []string{
		`{"_id": 1, "results": [82, 85, 88]}`,
		`{"_id": 2, "results": [75, 88, 89]}`,
	}}
	runCollection(t, scores, []collCase{
		{`{"results": {"$elemMatch": {"$gte": 80, "$lt": 85}}}`, "1"},
		{`{"results": {"$gte": 80, "$lt": 85}}`, "1 2"},
		{`{"results": {"$elemMatch": {"$not": {"$gte": 80}}}}`, "2"},
		{`{"results": {"$elemMatch": {"$in": [75, 76]}}}`, "2"},
	})
	survey := collection{key: "_id", docs: []string{
		`{"_id": 1, "results": [{"product": "abc", "score": 10}, {"product": "xyz", "score": 5}]}`,
		`{"_id": 2, "results": [{"product": "abc", "score": 8}, {"product": "xyz", "score": 7}]}`,
		`{"_id": 3, "results": [{"product": "abc", "score": 7}, {"product": "xyz", "score": 8}]}`,
		`{"_id": 4, "results": [{"product": "abc", "score": 7}, {"product": "def", "score": 8}]}`,
		`{"_id": 5, "results": {"product": "xyz", "score": 9}}`,
	}}
	runCollection(t, survey, []collCase{
		{`{"results": {"$elemMatch": {"product": "xyz", "score": {"$gte": 8}}}}`, "3"},
		{`{"results": {"$elemMatch": {"product": "xyz"}}}`, "1 2 3"},
		{`{"results.product": "xyz"}`, "1 2 3 5"},
		{`{"results": {"$elemMatch": {"product": {"$ne": "xyz"}}}}`, "1 2 3 4"},
		{`{"results.product": {"$ne": "xyz"}}`, "4"},
		{`{"results": {"$elemMatch": {"$or": [{"score": 10}, {"product": "def"}]}}}`, "1 4"},
		// Different elements may satisfy each condition without $elemMatch.
		{`{"results.product": "xyz", "results.score": {"$gte": 8}}`, "1 2 3 5"},
	})
}

// https://www.mongodb.com/docs/manual/reference/operator/query/size/
// https://www.mongodb.com/docs/manual/reference/operator/query/not/
// https://www.mongodb.com/docs/manual/reference/operator/query/nor/
// https://www.mongodb.com/docs/manual/reference/operator/query/and/
// https://www.mongodb.com/docs/manual/reference/operator/query/or/
func TestMatchLogical(t *testing.T) {
	inventory := collection{key: "_id", docs: []string{
		`{"_id": 1, "item": "Freezer", "price": 1.99, "sale": true, "qty": 5}`,
		`{"_id": 2, "item": "Grill", "price": 2.5, "sale": false, "qty": 20}`,
		`{"_id": 3, "item": "Lamp", "price": 1.5, "qty": 30}`,
		`{"_id": 4, "item": "Table", "sale": true}`,
		`{"_id": 5, "item": "Chair"}`,
	}}
	runCollection(t, inventory, []collCase{
		{`{"price": {"$not": {"$gt": 1.99}}}`, "1 3 4 5"},
		{`{"item": {"$not": {"$regularExpression": {"pattern": "^F", "options": ""}}}}`, "2 3 4 5"},
		{`{"$nor": [{"price": 1.99}, {"sale": true}]}`, "2 3 5"},
		{`{"$nor": [{"price": 1.99}, {"qty": {"$lt": 20}}, {"sale": true}]}`, "2 3 5"},
		{`{"$nor": [{"price": 1.99}, {"price": {"$exists": false}}, {"sale": true}, {"sale": {"$exists": false}}]}`, "2"},
		{`{"$and": [{"price": {"$ne": 1.99}}, {"price": {"$exists": true}}]}`, "2 3"},
		{`{"$and": [{"$or": [{"qty": {"$lt": 10}}, {"qty": {"$gt": 25}}]}, {"$or": [{"sale": true}, {"price": {"$lt": 5}}]}]}`, "1 3"},
		{`{"$or": [{"qty": {"$lt": 20}}, {"price": 2.5}]}`, "1 2"},
		{`{"$or": [{"item": "Chair"}]}`, "5"},
		{`{"$alwaysFalse": 1}`, ""},
		{`{"$comment": "ignored", "item": "Lamp"}`, "3"},
	})
	sizes := collection{key: "_id", docs: []string{
		`{"_id": 1, "field": ["red", "green"]}`,
		`{"_id": 2, "field": "apple"}`,
		`{"_id": 3, "field": []}`,
		`{"_id": 4, "field": [["a", "b"]]}`,
		`{"_id": 5, "field": [{"x": 1}, {"x": 2}]}`,
	}}
	runCollection(t, sizes, []collCase{
		{`{"field": {"$size": 2}}`, "1 5"},
		{`{"field": {"$size": 0}}`, "3"},
		{`{"field": {"$size": 1}}`, "4"},
		{`{"field": {"$size": 2.0}}`, "1 5"},
		{`{"field": {"$not": {"$size": 2}}}`, "2 3 4"},
	})
}

// https://www.mongodb.com/docs/manual/core/document/#dot-notation and
// https://www.mongodb.com/docs/manual/tutorial/query-arrays/ — single
// documents exercising path traversal corner cases.
func TestMatchPaths(t *testing.T) {
	cases := []struct {
		name, filter, doc string
		want              bool
	}{
		{"array element equality", `{"a": 1}`, `{"a": [1, 2]}`, true},
		{"whole array equality", `{"a": [1, 2]}`, `{"a": [1, 2]}`, true},
		{"array order matters", `{"a": [2, 1]}`, `{"a": [1, 2]}`, false},
		{"nested array element equals operand array", `{"a": [1, 2]}`, `{"a": [[1, 2], 3]}`, true},
		{"only one level of leaf expansion", `{"a": 1}`, `{"a": [[1]]}`, false},
		{"leaf expansion under path", `{"a.b": 1}`, `{"a": [{"b": [1, 2]}]}`, true},
		{"whole array under path", `{"a.b": [1, 2]}`, `{"a": [{"b": [1, 2]}]}`, true},
		{"nested arrays are not traversed by non-leaf", `{"a.b": 1}`, `{"a": [[{"b": 1}]]}`, false},
		{"index into nested array", `{"a.0.b": 1}`, `{"a": [[{"b": 1}]]}`, true},
		{"numeric component indexes array", `{"a.1": 5}`, `{"a": [4, 5]}`, true},
		{"numeric component as field name", `{"a.1": 5}`, `{"a": {"1": 5}}`, true},
		{"numeric component on array of docs", `{"a.0.b": 2}`, `{"a": [{"b": 2}, {"b": 3}]}`, true},
		{"numeric component second element", `{"a.0.b": 3}`, `{"a": [{"b": 2}, {"b": 3}]}`, false},
		{"numeric component also matches field in element docs", `{"a.0": 1}`, `{"a": [{"0": 1}]}`, true},
		{"index out of range is missing", `{"a.5": null}`, `{"a": [1]}`, true},
		{"index element present is not null", `{"a.0": null}`, `{"a": [1]}`, false},
		{"deep path", `{"a.b.c.d": "x"}`, `{"a": {"b": [{"c": {"d": ["y", "x"]}}]}}`, true},
		{"path through scalar", `{"a.b": 1}`, `{"a": 1}`, false},
		{"path through scalar is null", `{"a.b": null}`, `{"a": 1}`, true},
		{"$ne with array containing value", `{"a": {"$ne": 1}}`, `{"a": [1, 2]}`, false},
		{"$ne with array not containing value", `{"a": {"$ne": 3}}`, `{"a": [1, 2]}`, true},
		{"$ne whole array", `{"a": {"$ne": [1, 2]}}`, `{"a": [1, 2]}`, false},
		{"$nin over dotted array path", `{"a.b": {"$nin": [1]}}`, `{"a": [{"b": 2}, {"b": 1}]}`, false},
		{"$exists on empty array", `{"a": {"$exists": true}}`, `{"a": []}`, true},
		{"$exists array element path", `{"a.b": {"$exists": true}}`, `{"a": [{"c": 1}, {"b": null}]}`, true},
		{"$exists through array of scalars", `{"a.b": {"$exists": true}}`, `{"a": [1, 2]}`, false},
		{"$size does not expand nested", `{"a.b": {"$size": 2}}`, `{"a": [{"b": [1, 2]}, {"b": [1]}]}`, true},
		{"$elemMatch on nested path", `{"a.b": {"$elemMatch": {"$gt": 5}}}`, `{"a": [{"b": [1, 9]}]}`, true},
		{"$elemMatch needs array", `{"a": {"$elemMatch": {"$gt": 5}}}`, `{"a": 9}`, false},
		{"$elemMatch element is array", `{"a": {"$elemMatch": {"0": 1}}}`, `{"a": [[1, 2]]}`, true},
		{"$gt compares arrays as a whole too", `{"a": {"$gt": [1]}}`, `{"a": [1, 2]}`, true},
		{"$lt with mixed element types", `{"a": {"$lt": 3}}`, `{"a": ["x", 2]}`, true},
		{"embedded doc numeric equality", `{"a": {"b": 1}}`, `{"a": {"b": 1.0}}`, true},
		{"embedded doc extra field", `{"a": {"b": 1}}`, `{"a": {"b": 1, "c": 2}}`, false},
		{"embedded doc in array", `{"a": {"b": 1}}`, `{"a": [{"b": 2}, {"b": 1}]}`, true},
		{"objectid equality", `{"_id": {"$oid": "5234cc89687ea597eabee675"}}`, `{"_id": {"$oid": "5234cc89687ea597eabee675"}}`, true},
		{"objectid mismatch", `{"_id": {"$oid": "5234cc89687ea597eabee675"}}`, `{"_id": {"$oid": "5234cc89687ea597eabee676"}}`, false},
		{"date range", `{"d": {"$gte": {"$date": "2024-01-01T00:00:00Z"}, "$lt": {"$date": "2024-02-01T00:00:00Z"}}}`, `{"d": {"$date": "2024-01-15T00:00:00Z"}}`, true},
		{"date vs string no match", `{"d": {"$gte": {"$date": "2024-01-01T00:00:00Z"}}}`, `{"d": "2024-01-15"}`, false},
		{"bool equality", `{"ok": true}`, `{"ok": true}`, true},
		{"bool vs number", `{"ok": true}`, `{"ok": 1}`, false},
		{"int64 large equality", `{"n": {"$numberLong": "9007199254740993"}}`, `{"n": 9007199254740992.0}`, false},
		{"int64 vs double exact", `{"n": {"$gt": {"$numberLong": "9007199254740992"}}}`, `{"n": 9007199254740994.0}`, true},
		{"decimal vs int", `{"n": {"$numberDecimal": "1E+2"}}`, `{"n": 100}`, true},
		{"string byte order", `{"s": {"$gt": "Z"}}`, `{"s": "a"}`, true},
		{"dbref literal equality", `{"r": {"$ref": "c", "$id": 1}}`, `{"r": {"$ref": "c", "$id": 1}}`, true},
		{"empty field name", `{"": 1}`, `{"": 1}`, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Compile(bsontest.Doc(t, tc.filter))
			if err != nil {
				t.Fatal(err)
			}
			if got := f.Match(bsontest.Doc(t, tc.doc)); got != tc.want {
				t.Errorf("Match(%s, %s) = %v, want %v", tc.filter, tc.doc, got, tc.want)
			}
		})
	}
}

// Rules as changegate users write them, against change events.
func TestMatchChangeEvents(t *testing.T) {
	events := collection{key: "n", docs: []string{
		`{"n": 1, "operationType": "insert", "ns": {"db": "shop", "coll": "orders"}, "documentKey": {"_id": 1}, "fullDocument": {"_id": 1, "status": "paid", "total": 150, "items": [{"sku": "a", "qty": 2}]}}`,
		`{"n": 2, "operationType": "update", "ns": {"db": "shop", "coll": "orders"}, "documentKey": {"_id": 2}, "fullDocument": {"_id": 2, "status": "paid", "total": 99.5}, "updateDescription": {"updatedFields": {"status": "paid"}, "removedFields": []}}`,
		`{"n": 3, "operationType": "delete", "ns": {"db": "shop", "coll": "orders"}, "documentKey": {"_id": 3}}`,
		`{"n": 4, "operationType": "update", "ns": {"db": "shop", "coll": "users"}, "documentKey": {"_id": 4}, "fullDocument": {"_id": 4, "status": "paid", "total": {"$numberDecimal": "100.00"}}, "updateDescription": {"updatedFields": {"email": "x@y"}, "removedFields": ["phone"]}}`,
	}}
	runCollection(t, events, []collCase{
		{`{"fullDocument.status": "paid", "fullDocument.total": {"$gte": 100}, "operationType": {"$in": ["insert", "update"]}}`, "1 4"},
		{`{"ns.coll": "orders", "operationType": "delete"}`, "3"},
		{`{"ns": {"db": "shop", "coll": "users"}}`, "4"},
		{`{"updateDescription.removedFields": "phone"}`, "4"},
		{`{"updateDescription.updatedFields.status": {"$exists": true}}`, "2"},
		{`{"fullDocument.items.sku": "a"}`, "1"},
		{`{"fullDocument": {"$exists": false}}`, "3"},
		{`{"operationType": {"$nin": ["delete"]}, "fullDocument.total": {"$lt": 100}}`, "2"},
	})
}

func TestCompileErrors(t *testing.T) {
	cases := []struct{ filter, want string }{
		{`{"fullDocument.total": {"$foo": 1}}`, "unknown operator $foo at fullDocument.total"},
		{`{"a": {"$gt": 1, "b": 2}}`, "unknown operator b at a"},
		{`{"$foo": 1}`, "unknown top level operator $foo"},
		{`{"$where": "true"}`, "unknown top level operator $where"},
		{`{"a": {"$in": 1}}`, "$in needs an array at a"},
		{`{"a": {"$nin": {"x": 1}}}`, "$nin needs an array at a"},
		{`{"a": {"$in": [{"$gt": 1}]}}`, "$in cannot contain $ operators at a"},
		{`{"$and": []}`, "$and needs a non-empty array"},
		{`{"$or": {}}`, "$or needs a non-empty array"},
		{`{"$nor": [1]}`, "$nor entries must be documents"},
		{`{"a": {"$regex": "("}}`, "$regex: invalid pattern \"(\": missing closing ): `(` at a"},
		{`{"a": {"$regex": "a", "$options": "q"}}`, "$regex: invalid flag in regex options: q at a"},
		{`{"a": {"$options": "i"}}`, "$options needs a $regex at a"},
		{`{"a": {"$regex": 1}}`, "$regex has to be a string at a"},
		{`{"a": {"$size": "2"}}`, "$size needs a number at a"},
		{`{"a": {"$size": -1}}`, "$size may not be negative at a"},
		{`{"a": {"$size": 1.5}}`, "$size must be a whole number at a"},
		{`{"a": {"$type": "strng"}}`, "$type: unknown type name alias strng at a"},
		{`{"a": {"$type": 42}}`, "$type: invalid numerical type code 42 at a"},
		{`{"a": {"$mod": [0, 1]}}`, "divisor cannot be 0 at a"},
		{`{"a": {"$mod": [1]}}`, "malformed mod, not enough elements at a"},
		{`{"a": {"$mod": [1, 2, 3]}}`, "malformed mod, too many elements at a"},
		{`{"a": {"$mod": 3}}`, "malformed mod, needs to be an array at a"},
		{`{"a": {"$not": {}}}`, "$not cannot be empty at a"},
		{`{"a": {"$not": 5}}`, "$not needs a regex or a document at a"},
		{`{"a": {"$elemMatch": 5}}`, "$elemMatch needs an object at a"},
		{`{"a": {"$all": 5}}`, "$all needs an array at a"},
		{`{"a": {"$ne": {"$regularExpression": {"pattern": "x", "options": ""}}}}`, "$ne cannot have a regex at a"},
		{`{"a": {"$undefined": true}}`, "cannot compare to undefined at a"},
		{`{"a.b": {"$elemMatch": {"$gt": 1, "$bad": 2}}}`, "unknown operator $bad at a.b"},
		{`{"$or": [{"a": {"$bad": 1}}]}`, "unknown operator $bad at a"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			_, err := Compile(bsontest.Doc(t, tc.filter))
			if err == nil {
				t.Fatalf("Compile(%s) succeeded, want error %q", tc.filter, tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("Compile(%s) error = %q, want %q", tc.filter, err, tc.want)
			}
		})
	}
}

func TestCompileInvalidBSON(t *testing.T) {
	if _, err := Compile(bson.Raw{1, 2, 3}); err == nil {
		t.Fatal("Compile accepted malformed BSON")
	}
	f, err := Compile(nil)
	if err != nil || !f.Match(bsontest.Doc(t, `{"a": 1}`)) {
		t.Fatalf("nil filter: %v", err)
	}
}

func TestMatchMalformedDocument(t *testing.T) {
	f := MustCompile(bsontest.Doc(t, `{"a": 1}`))
	good := bsontest.Doc(t, `{"a": 1}`)
	for i := range len(good) {
		_ = f.Match(good[:i]) // must not panic
	}
}

func TestFilterConcurrentUse(t *testing.T) {
	f := MustCompile(bsontest.Doc(t, `{"a": {"$in": ["x", "y"]}, "b": {"$regex": "^z"}}`))
	d := bsontest.Doc(t, `{"a": "y", "b": "zz"}`)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				if !f.Match(d) {
					t.Error("no match")
					return
				}
			}
		}()
	}
	wg.Wait()
}

// FuzzMatch checks that matching arbitrary bytes never panics.
func FuzzMatch(f *testing.F) {
	f.Add([]byte(bsontest.Doc(f, bsontest.ChangeEvent)))
	f.Add([]byte(bsontest.Doc(f, `{"a": [1, {"b": [2, {"c": 3}]}], "s": "x"}`)))
	filters := []*Filter{
		MustCompile(bsontest.Doc(f, `{"fullDocument.status": "paid", "fullDocument.total": {"$gte": 100}}`)),
		MustCompile(bsontest.Doc(f, `{"a.b.c": {"$in": [3, null]}, "s": {"$regex": "x"}, "a": {"$elemMatch": {"b": {"$size": 2}}}}`)),
		MustCompile(bsontest.Doc(f, `{"a.1.b": {"$not": {"$type": "string"}}, "$or": [{"a": {"$all": [1]}}, {"s": {"$exists": false}}]}`)),
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, flt := range filters {
			flt.Match(b)
		}
	})
}
