package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/changegate/changegate/receive"
	"github.com/changegate/changegate/sinks/webhook"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func open(t *testing.T) *Mirror {
	t.Helper()
	m, err := Open(filepath.Join(t.TempDir(), "mirror.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func docs(t *testing.T, m *Mirror) map[string]string {
	t.Helper()
	rows, err := m.db.Query(`SELECT coll || '/' || id, doc FROM docs`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, d string
		if err := rows.Scan(&k, &d); err != nil {
			t.Fatal(err)
		}
		out[k] = d
	}
	return out
}

const (
	insA   = `{"id":"s:1","operationType":"insert","ns":{"db":"shop","coll":"orders"},"documentKey":{"_id":1},"fullDocument":{"_id":1,"status":"new","items":[{"sku":"a"}]},"txn":{"id":"T1","index":0}}`
	insB   = `{"id":"s:2","operationType":"insert","ns":{"db":"shop","coll":"lines"},"documentKey":{"_id":7},"fullDocument":{"_id":7,"order":1,"qty":2},"txn":{"id":"T1","index":1}}`
	updA   = `{"id":"s:3","operationType":"update","ns":{"db":"shop","coll":"orders"},"documentKey":{"_id":1},"updateDescription":{"updatedFields":{"status":"paid","items.0.sku":"b"},"removedFields":[]},"txn":{"id":"T1","index":2,"last":true}}`
	delB   = `{"id":"s:4","operationType":"delete","ns":{"db":"shop","coll":"lines"},"documentKey":{"_id":7}}`
	broken = `{"id":"s:9","operationType":"update","ns":{"db":"shop","coll":"orders"},"documentKey":{"_id":1},"txn":{"id":"T2","index":1,"last":true}}`
)

// A transaction is applied whole; one whose later change cannot be applied
// leaves nothing of it behind; a re-delivery is skipped.
func TestApplyTransaction(t *testing.T) {
	m := open(t)
	ctx := context.Background()
	if err := m.ApplyBody(ctx, []byte("["+insA+","+insB+","+updA+"]")); err != nil {
		t.Fatal(err)
	}
	got := docs(t, m)
	if got["orders/1"] != `{"_id":1,"status":"paid","items":[{"sku":"b"}]}` || got["lines/7"] != `{"_id":7,"order":1,"qty":2}` {
		t.Fatalf("docs = %v", got)
	}
	// A failing transaction: its first change (a delete) is rolled back.
	bad := `[` + `{"id":"s:8","operationType":"delete","ns":{"db":"shop","coll":"lines"},"documentKey":{"_id":7},"txn":{"id":"T2","index":0}},` + broken + `]`
	if err := m.ApplyBody(ctx, []byte(bad)); err == nil {
		t.Fatal("a transaction with an unusable change was applied")
	}
	if got := docs(t, m); got["lines/7"] == "" {
		t.Fatalf("part of a failed transaction was applied: %v", got)
	}
	// A re-delivery of the first transaction after a later change: not
	// applied again (the later state stays).
	if err := m.ApplyBody(ctx, []byte(delB)); err != nil {
		t.Fatal(err)
	}
	if err := m.ApplyBody(ctx, []byte("["+insA+","+insB+","+updA+"]")); err != nil {
		t.Fatal(err)
	}
	if got := docs(t, m); got["lines/7"] != "" || got["orders/1"] != `{"_id":1,"status":"paid","items":[{"sku":"b"}]}` {
		t.Fatalf("after re-delivery: %v", got)
	}
}

// A transaction split into parts is applied once its last part arrived,
// all at once.
func TestApplyParts(t *testing.T) {
	m := open(t)
	ctx := context.Background()
	p1 := `[{"id":"s:1","operationType":"insert","ns":{"db":"shop","coll":"orders"},"documentKey":{"_id":1},"fullDocument":{"_id":1},"txn":{"id":"T","index":0,"part":1,"parts":2}}]`
	p2 := `[{"id":"s:2","operationType":"insert","ns":{"db":"shop","coll":"orders"},"documentKey":{"_id":2},"fullDocument":{"_id":2},"txn":{"id":"T","index":1,"last":true,"part":2,"parts":2}}]`
	if err := m.ApplyBody(ctx, []byte(p1)); err != nil {
		t.Fatal(err)
	}
	if got := docs(t, m); len(got) != 0 {
		t.Fatalf("part 1 of 2 applied alone: %v", got)
	}
	if err := m.ApplyBody(ctx, []byte(p1)); err != nil { // a re-delivery of part 1
		t.Fatal(err)
	}
	if err := m.ApplyBody(ctx, []byte(p2)); err != nil {
		t.Fatal(err)
	}
	if got := docs(t, m); len(got) != 2 {
		t.Fatalf("after both parts: %v", got)
	}
}

// A transaction sent in parts as it is read says how many parts there are
// only in its last: the earlier ones are kept, not applied; a part 1
// starts the transaction again (a re-delivery cut elsewhere).
func TestApplyStreamedParts(t *testing.T) {
	m := open(t)
	ctx := context.Background()
	el := func(id, index int, txn string) string {
		return fmt.Sprintf(`{"id":"s:%d","operationType":"insert","ns":{"db":"shop","coll":"orders"},"documentKey":{"_id":%d},"fullDocument":{"_id":%d},"txn":{"id":"U","index":%d%s}}`, id, id, id, index, txn)
	}
	first := "[" + el(1, 0, `,"part":1`) + "," + el(2, 1, `,"part":1`) + "]"
	for _, body := range []string{
		first,
		"[" + el(3, 2, `,"part":2`) + "]",
		// A re-delivery, cut elsewhere: part 1 holds the first event only.
		"[" + el(1, 0, `,"part":1`) + "]",
		"[" + el(2, 1, `,"part":2`) + "," + el(3, 2, `,"part":2`) + "]",
	} {
		if err := m.ApplyBody(ctx, []byte(body)); err != nil {
			t.Fatal(err)
		}
		if got := docs(t, m); len(got) != 0 {
			t.Fatalf("a part without the last applied: %v", got)
		}
	}
	if err := m.ApplyBody(ctx, []byte("["+el(4, 3, `,"last":true,"part":3,"parts":3`)+"]")); err != nil {
		t.Fatal(err)
	}
	if got := docs(t, m); len(got) != 4 {
		t.Fatalf("after the last part: %v", got)
	}
}

// The handler applies signed requests and refuses unsigned ones.
func TestHandler(t *testing.T) {
	m := open(t)
	v, err := receive.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(v))
	defer srv.Close()
	post := func(body string, sign bool) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewBufferString(body))
		if sign {
			now := time.Now()
			sig, err := webhook.Sign([]string{secret}, "batch_x", now, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("webhook-id", "batch_x")
			req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
			req.Header.Set("webhook-signature", sig)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("["+insA+","+insB+"]", false); code != http.StatusUnauthorized && code != http.StatusBadRequest {
		t.Fatalf("unsigned request: %d", code)
	}
	if code := post("["+insA+","+insB+"]", true); code != http.StatusNoContent {
		t.Fatalf("signed request: %d", code)
	}
	if got := docs(t, m); len(got) != 2 {
		t.Fatalf("docs = %v", got)
	}
}
