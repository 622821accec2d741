// Package query implements MongoDB's query, sort, projection and update
// semantics as pure functions over raw BSON.
//
// It is shared by changegate's router, whose rules are written in MongoDB
// query syntax and evaluated against change events, and by the in-repo
// MongoDB wire-protocol test server (test/mongowire), which uses it to
// answer find, update, aggregate $match/$sort/$project and change stream
// $match stages.
//
// The entry points are:
//
//   - [Compile] and [Filter.Match] for query filters;
//   - [Compare] and [Equal] for MongoDB's BSON comparison order;
//   - [CompileSort] and [Sort.Compare] for sort specifications;
//   - [Project] for find projections;
//   - [ApplyUpdate], [IsReplacement] and [UpsertSeed] for update documents.
//
// Every function is pure: inputs are never modified, outputs never alias
// inputs in a way that a later call could change, and compiled values
// ([Filter], [Sort]) are immutable and safe for concurrent use.
//
// Behaviour follows the MongoDB 8.0 manual; known deviations are listed in
// the doc comments of the functions concerned (mainly: regular expressions
// use Go's RE2 syntax instead of PCRE).
package query
