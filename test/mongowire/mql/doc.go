// Package mql implements the MongoDB semantics the test server
// (test/mongowire) needs beyond query filters: update operators and
// replacements ([ApplyUpdate], [IsReplacement]), upsert seeding
// ([UpsertSeed]), sort specifications ([CompileSort]) and find projections
// ([Project]), as pure functions over raw BSON.
//
// Filters, the BSON comparison order and single-value conditions come from
// package query, the same code changegate's rules run, so the test server
// and the product agree on what matches and how values order. This package
// is for tests only: nothing in changegate's binary imports it (see
// cmd/changegate's dependency test).
//
// Every function is pure: inputs are never modified, outputs never alias
// inputs in a way that a later call could change, and compiled values
// ([Sort], [Projection]) are immutable and safe for concurrent use.
//
// Behaviour follows the MongoDB 8.0 manual; known deviations are listed in
// the doc comments of the functions concerned.
package mql
