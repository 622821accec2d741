package mongowire

// This file is the seam between the server and query semantics: filters and
// the comparison order from package github.com/changegate/changegate/query,
// the same evaluator the product's router uses, and sorts, projections and
// updates from package mql.

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/changegate/changegate/query"
	"github.com/changegate/changegate/test/mongowire/mql"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// matcher is a compiled query filter.
type matcher interface {
	Match(doc bson.Raw) bool
}

// sorter is a compiled sort specification.
type sorter interface {
	Compare(a, b bson.Raw) int
}

type matchAll struct{}

func (matchAll) Match(bson.Raw) bool { return true }

// compileFilter compiles a query filter; an empty or nil filter matches all.
func compileFilter(filter bson.Raw) (matcher, error) {
	return compileFilterAt(filter, time.Now())
}

// compileFilterAt is compileFilter with now as the $$NOW of $expr clauses
// (exprfilter.go).
func compileFilterAt(filter bson.Raw, now time.Time) (matcher, error) {
	if len(filter) <= 5 {
		return matchAll{}, nil
	}
	if usesExpr(filter) {
		return compileExprFilter(filter, now)
	}
	return query.Compile(filter)
}

// compileSort compiles a sort specification such as {a: 1, b: -1}.
func compileSort(spec bson.Raw) (sorter, error) { return mql.CompileSort(spec) }

// compareValues orders BSON values with MongoDB's type-bracketed order.
func compareValues(a, b bson.RawValue) int { return query.Compare(a, b) }

// eqValue reports whether MongoDB considers a and b equal.
func eqValue(a, b bson.RawValue) bool { return query.Equal(a, b) }

// project applies a find-style projection.
func project(doc bson.Raw, projection bson.Raw) (bson.Raw, error) {
	return mql.Project(doc, projection)
}

// isReplacement reports whether an update document is a replacement.
func isReplacement(update bson.Raw) bool { return mql.IsReplacement(update) }

// upsertSeed returns the equality fields of a filter, to seed an upsert.
// $expr clauses contribute nothing to the seed (exprfilter.go).
func upsertSeed(filter bson.Raw) (bson.D, error) { return mql.UpsertSeed(withoutExpr(filter)) }

// applyUpdate applies an operator update document.
func applyUpdate(doc bson.Raw, update bson.Raw, insert bool, now time.Time) (bson.Raw, *mql.UpdateDescription, error) {
	return mql.ApplyUpdate(doc, update, mql.UpdateOptions{Insert: insert, Now: now})
}

// queryErr converts an error of package query or mql into a command error,
// keeping the server code it carries (default BadValue).
func queryErr(err error) *CommandError {
	var qe *mql.Error
	if errors.As(err, &qe) {
		return &CommandError{Code: int32(qe.Code), Message: qe.Message}
	}
	return &CommandError{Code: codeBadValue, Message: err.Error()}
}

func num(v bson.RawValue) float64 {
	switch v.Type {
	case bson.TypeInt32:
		return float64(v.Int32())
	case bson.TypeInt64:
		return float64(v.Int64())
	case bson.TypeDouble:
		return v.Double()
	case bson.TypeDecimal128:
		f, _ := strconv.ParseFloat(v.Decimal128().String(), 64)
		return f
	}
	return math.NaN()
}

// lookupPath returns the values a dotted path reaches, descending into arrays.
func lookupPath(doc bson.Raw, path string) []bson.RawValue {
	return lookupParts(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: doc}, strings.Split(path, "."))
}

func lookupParts(v bson.RawValue, parts []string) []bson.RawValue {
	if len(parts) == 0 {
		return []bson.RawValue{v}
	}
	switch v.Type {
	case bson.TypeEmbeddedDocument:
		f, err := bson.Raw(v.Value).LookupErr(parts[0])
		if err != nil {
			return nil
		}
		return lookupParts(f, parts[1:])
	case bson.TypeArray:
		if _, err := strconv.Atoi(parts[0]); err == nil {
			f, err := bson.Raw(v.Value).LookupErr(parts[0])
			if err == nil {
				return lookupParts(f, parts[1:])
			}
		}
		var out []bson.RawValue
		vals, _ := bson.Raw(v.Value).Values()
		for _, e := range vals {
			if e.Type == bson.TypeEmbeddedDocument {
				out = append(out, lookupParts(e, parts)...)
			}
		}
		return out
	}
	return nil
}
