package config

import (
	"os"
	"testing"
)

func BenchmarkParseExample(b *testing.B) {
	data, err := os.ReadFile("../config.example.toml")
	if err != nil {
		b.Fatal(err)
	}
	env := envOf(map[string]string{"MONGODB_URI": "mongodb://x", "BILLING_WEBHOOK_SECRET": "raw", "WAREHOUSE_PASSWORD": "p"})
	for b.Loop() {
		if _, err := Parse("c.toml", data, env); err != nil {
			b.Fatal(err)
		}
	}
}
