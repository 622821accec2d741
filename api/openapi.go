package api

import (
	_ "embed"
	"net/http"
)

// openAPI is the OpenAPI 3.1 document of /api/v1, served at
// /api/v1/openapi.json; TestOpenAPIDescribesEveryRoute holds it to the
// registered routes.
//
//go:embed openapi.json
var openAPI []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPI)
}
