// Command hello is what the tests of package testenv build.
package main

import "fmt"

func main() { fmt.Println("hello") }
