// Package mongotest gives tests a MongoDB: the deployment named by
// CHANGEGATE_TEST_MONGODB_URI when it is set (so the same tests run against a
// real replica set), otherwise a test/mongowire server started for the test.
package mongotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/test/mongowire"
)

// EnvURI is the environment variable naming a real MongoDB deployment.
const EnvURI = "CHANGEGATE_TEST_MONGODB_URI"

// URI returns the connection string to test against and, when it is a
// test/mongowire server started for this test (closed at cleanup), that
// server; srv is nil against a real MongoDB.
func URI(t testing.TB) (uri string, srv *mongowire.Server) {
	t.Helper()
	if uri := os.Getenv(EnvURI); uri != "" {
		return uri, nil
	}
	srv, err := mongowire.Start(mongowire.Options{})
	if err != nil {
		t.Fatalf("start mongowire: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv.URI(), srv
}

// Client connects to uri; it is disconnected at cleanup.
func Client(t testing.TB, uri string) *mongo.Client {
	t.Helper()
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(10 * time.Second))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Disconnect(ctx)
	})
	return client
}

// UniqueName returns prefix followed by random hex, for a database name
// no other test uses.
func UniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Database returns a fresh, uniquely named database, dropped at cleanup.
func Database(t testing.TB, prefix string) *mongo.Database {
	t.Helper()
	uri, _ := URI(t)
	db := Client(t, uri).Database(UniqueName(prefix))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := db.Drop(ctx); err != nil {
			t.Errorf("drop test database: %v", err)
		}
	})
	return db
}
