package query

import (
	"testing"

	"github.com/changegate/changegate/test/bsontest"
)

func TestCondition(t *testing.T) {
	tests := []struct {
		cond  string
		value string
		want  bool
	}{
		{`{"$gte": 5}`, `6`, true},
		{`{"$gte": 5}`, `4.5`, false},
		{`{"$gte": 5, "$lt": 10}`, `10`, false},
		// The value itself is tested: an array is not searched.
		{`{"$gte": 5}`, `[6]`, false},
		{`{"$size": 1}`, `[6]`, true},
		{`{"$in": ["a", "b"]}`, `"b"`, true},
		{`{"$not": {"$gt": 1}}`, `1`, true},
		{`{"$regularExpression": {"pattern": "^a", "options": "i"}}`, `"Apple"`, true},
		{`{"$regularExpression": {"pattern": "^a", "options": ""}}`, `"Apple"`, false},
	}
	for _, tc := range tests {
		c, err := CompileCondition("arr", bsontest.Value(t, tc.cond))
		if err != nil {
			t.Fatalf("CompileCondition(%s): %v", tc.cond, err)
		}
		if got := c.Match(bsontest.Value(t, tc.value)); got != tc.want {
			t.Errorf("%s matches %s = %v, want %v", tc.cond, tc.value, got, tc.want)
		}
	}
}

func TestConditionErrors(t *testing.T) {
	tests := []struct {
		cond, want string
	}{
		{`{"$foo": 1}`, "unknown operator $foo at arr"},
		{`{"$or": [{"a": 1}]}`, "a condition needs an operator document or a regular expression at arr"},
		{`{"a": 1}`, "a condition needs an operator document or a regular expression at arr"},
		{`{"$ref": "c", "$id": 1}`, "a condition needs an operator document or a regular expression at arr"},
		{`1`, "a condition needs an operator document or a regular expression at arr"},
	}
	for _, tc := range tests {
		_, err := CompileCondition("arr", bsontest.Value(t, tc.cond))
		if err == nil || err.Error() != tc.want {
			t.Errorf("CompileCondition(%s) error = %v, want %q", tc.cond, err, tc.want)
		}
	}
}
