// Package query is the filter language of changegate's rules: MongoDB query
// filters compiled once and matched against change events, as pure
// functions over raw BSON.
//
// It owns:
//
//   - [Compile] and [Filter.Match] for query filters;
//   - [Compare] and [Equal], MongoDB's BSON comparison order, which the
//     filters use and which is defined here only;
//   - [CompileCondition] and [Condition.Match], the test of a single value
//     that $elemMatch applies to array elements.
//
// The in-repo MongoDB wire-protocol test server (test/mongowire) answers
// find, aggregate $match and change stream $match stages with the same
// filters, and builds its update operators, sort and projection
// (test/mongowire/mql) on [Compare], [Equal] and [Condition]; those
// semantics are not part of this package and not linked into changegate.
//
// Every function is pure: inputs are never modified, and compiled values
// ([Filter], [Condition]) are immutable and safe for concurrent use.
//
// Behaviour follows the MongoDB 8.0 manual; known deviations are listed in
// the doc comments of the functions concerned (mainly: regular expressions
// use Go's RE2 syntax instead of PCRE).
package query
