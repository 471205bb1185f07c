module github.com/microvm/microvm

go 1.26.8

require (
	github.com/alecthomas/kong v0.8.0 // indirect
	github.com/bobuhiro11/gokvm v0.0.8-0.20231003020000-f53faca69d28 // indirect
	github.com/cpuguy83/go-md2man/v2 v2.0.7 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/russross/blackfriday/v2 v2.1.0 // indirect
	github.com/sirupsen/logrus v1.10.2 // indirect
	github.com/urfave/cli/v2 v2.27.7 // indirect
	github.com/xrash/smetrics v0.0.0-20240521201337-686a1a2994c1 // indirect
	golang.org/x/arch v0.2.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
