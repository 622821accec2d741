// Command txn-sqlite is a changegate webhook receiver that mirrors MongoDB
// collections into a SQLite database, applying each transaction atomically.
//
// Configure the sink with transactions = "group": a request then holds one
// whole transaction (a JSON array) or one single write (an object). The
// receiver applies a request's changes in one SQL transaction, so readers of
// the database never see part of a MongoDB transaction. A transaction too
// large for one request, or to be held whole in changegate's memory, comes
// in parts, in order ("txn": {"part"}, and "parts" on the last one); the
// parts are kept in a pending table until the last one arrived, then
// applied together. Every applied event id is recorded, so a re-delivery
// (at-least-once) is skipped.
//
// Each document is a row of table docs (coll, id, doc): id is the
// documentKey's _id and doc the document, both as relaxed Extended JSON
// text. Inserts and replaces store fullDocument; updates apply
// updatedFields and removedFields with SQLite's JSON functions (or store
// fullDocument when the source sends it); deletes remove the row.
//
//	WEBHOOK_SECRET=... go run . -db mirror.db -listen :8080
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"

	_ "modernc.org/sqlite"

	"github.com/changegate/changegate/receive"
)

func main() {
	dbPath := flag.String("db", "mirror.db", "SQLite database file")
	listen := flag.String("listen", ":8080", "address to listen on")
	flag.Parse()
	v, err := receive.NewVerifier(os.Getenv("WEBHOOK_SECRET"))
	if err != nil {
		log.Fatal(err)
	}
	m, err := Open(*dbPath)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	log.Fatal(http.ListenAndServe(*listen, m.Handler(v)))
}

// Mirror is the SQLite database changes are applied to. Safe for
// concurrent use (SQLite serializes the writes).
type Mirror struct{ db *sql.DB }

const schema = `
CREATE TABLE IF NOT EXISTS docs (coll TEXT NOT NULL, id TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (coll, id));
CREATE TABLE IF NOT EXISTS applied (event_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS pending_parts (txn_id TEXT NOT NULL, part INTEGER NOT NULL, parts INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (txn_id, part));
`

// Open opens (or creates) the database at path.
func Open(path string) (*Mirror, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1) // one writer: transactions apply one after the other
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, err
	}
	return &Mirror{db: db}, nil
}

// Close closes the database.
func (m *Mirror) Close() error { return m.db.Close() }

// Handler verifies each request's signature with v and applies it.
func (m *Mirror) Handler(v *receive.Verifier) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		msg, err := v.Request(r, 64<<20)
		if err != nil {
			http.Error(w, err.Error(), receive.StatusFor(err))
			return
		}
		if err := m.ApplyBody(r.Context(), msg.Body); err != nil {
			// 500: changegate retries the whole request.
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// ApplyBody applies one request body: an envelope, or an array of the
// envelopes of one transaction (or of one part of it).
func (m *Mirror) ApplyBody(ctx context.Context, body []byte) error {
	envs, err := receive.DecodeBatch(body)
	if err != nil {
		return err
	}
	if len(envs) == 0 {
		return nil
	}
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if t := envs[0].Txn; t != nil && t.Part > 0 {
		// One part of a transaction sent in parts: kept until the last
		// part (the one that says how many there are) is here, then all
		// applied in this SQL transaction. Parts come in order, so part 1
		// starts the transaction again (a re-delivery after a crash, whose
		// parts may be cut elsewhere): what was kept of it is dropped.
		if t.Part == 1 {
			if _, err := tx.ExecContext(ctx, `DELETE FROM pending_parts WHERE txn_id = ?`, t.ID); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO pending_parts (txn_id, part, parts, body) VALUES (?, ?, ?, ?)`,
			t.ID, t.Part, t.Parts, string(body)); err != nil {
			return err
		}
		var n, parts int
		if err := tx.QueryRowContext(ctx, `SELECT count(*), max(parts) FROM pending_parts WHERE txn_id = ?`, t.ID).Scan(&n, &parts); err != nil {
			return err
		}
		if parts == 0 || n < parts {
			return tx.Commit()
		}
		rows, err := tx.QueryContext(ctx, `SELECT body FROM pending_parts WHERE txn_id = ? ORDER BY part`, t.ID)
		if err != nil {
			return err
		}
		envs = envs[:0]
		for rows.Next() {
			var b string
			if err := rows.Scan(&b); err != nil {
				rows.Close()
				return err
			}
			part, err := receive.DecodeBatch([]byte(b))
			if err != nil {
				rows.Close()
				return err
			}
			envs = append(envs, part...)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM pending_parts WHERE txn_id = ?`, t.ID); err != nil {
			return err
		}
	}
	for _, e := range envs {
		if err := apply(ctx, tx, e); err != nil {
			return fmt.Errorf("event %s: %w", e.ID, err)
		}
	}
	return tx.Commit()
}

// apply applies one change in tx, unless its event id was applied before.
func apply(ctx context.Context, tx *sql.Tx, e receive.Envelope) error {
	res, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO applied (event_id) VALUES (?)`, e.ID)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil // a re-delivery
	}
	var key struct {
		ID json.RawMessage `json:"_id"`
	}
	if len(e.DocumentKey) > 0 {
		if err := json.Unmarshal(e.DocumentKey, &key); err != nil {
			return err
		}
	}
	id, coll := string(key.ID), e.NS.Coll
	switch e.OperationType {
	case "insert", "replace":
		_, err = tx.ExecContext(ctx, `INSERT OR REPLACE INTO docs (coll, id, doc) VALUES (?, ?, json(?))`, coll, id, string(e.FullDocument))
	case "update":
		if len(e.FullDocument) > 0 {
			_, err = tx.ExecContext(ctx, `INSERT OR REPLACE INTO docs (coll, id, doc) VALUES (?, ?, json(?))`, coll, id, string(e.FullDocument))
			break
		}
		if e.UpdateDescription == nil {
			return errors.New("update without updateDescription or fullDocument")
		}
		for path, val := range e.UpdateDescription.UpdatedFields {
			if _, err = tx.ExecContext(ctx, `UPDATE docs SET doc = json_set(doc, ?, json(?)) WHERE coll = ? AND id = ?`,
				jsonPath(path), string(val), coll, id); err != nil {
				return err
			}
		}
		for _, path := range e.UpdateDescription.RemovedFields {
			if _, err = tx.ExecContext(ctx, `UPDATE docs SET doc = json_remove(doc, ?) WHERE coll = ? AND id = ?`,
				jsonPath(path), coll, id); err != nil {
				return err
			}
		}
	case "delete":
		_, err = tx.ExecContext(ctx, `DELETE FROM docs WHERE coll = ? AND id = ?`, coll, id)
	}
	return err
}

// jsonPath turns a MongoDB dotted path into a SQLite JSON path: "a.b" is
// $."a"."b", and a numeric member indexes an array ("items.2" is
// $."items"[2]; a document with numeric keys is not told apart here).
func jsonPath(dotted string) string {
	var b strings.Builder
	b.WriteString("$")
	for _, p := range strings.Split(dotted, ".") {
		if p != "" && strings.Trim(p, "0123456789") == "" {
			b.WriteString("[" + p + "]")
			continue
		}
		b.WriteString(`."` + strings.ReplaceAll(p, `"`, `\"`) + `"`)
	}
	return b.String()
}
