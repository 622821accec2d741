// Lambda handlers for changegate events, in a module of their own so that the
// main module does not depend on aws-lambda-go. The replace directive builds
// them against the changegate checkout they sit in.
module github.com/changegate/changegate/examples/lambda

go 1.26.0

require (
	github.com/aws/aws-lambda-go v1.55.1
	github.com/changegate/changegate v0.0.0-00010101000000-000000000000
	go.mongodb.org/mongo-driver/v2 v2.9.3
)

require (
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/hashicorp/go-retryablehttp v0.7.8 // indirect
	github.com/klauspost/compress v1.20.1 // indirect
	github.com/xdg-go/pbkdf2 v1.0.0 // indirect
	github.com/xdg-go/scram v1.2.0 // indirect
	github.com/xdg-go/stringprep v1.0.4 // indirect
	github.com/youmark/pkcs8 v0.0.0-20240726163527-a2c0da244d78 // indirect
	golang.org/x/crypto v0.53.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)

replace github.com/changegate/changegate => ../..
