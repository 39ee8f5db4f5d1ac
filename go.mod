module k3

go 1.26
