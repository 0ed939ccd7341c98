// Starts kinesalite (an in-memory Kinesis) on 127.0.0.1 for tests/api/kinesis.rs.
// Usage: node kinesalite.js PORT   (0 = any free port)
// Prints "listening <port>" once ready; exits when stdin closes, so a test
// process that dies never leaves it behind.
'use strict'

const kinesalite = require('kinesalite')

const port = Number(process.argv[2] || 0)
if (!Number.isInteger(port) || port < 0 || port > 65535) {
  console.error(`kinesalite.js: bad port ${JSON.stringify(process.argv[2])}`)
  process.exit(2)
}

const server = kinesalite({ createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 100000 })
server.on('error', (err) => {
  console.error(`kinesalite.js: ${err.message}`)
  process.exit(1)
})
server.listen(port, '127.0.0.1', () => {
  process.stdout.write(`listening ${server.address().port}\n`)
})

process.stdin.on('end', () => process.exit(0))
process.stdin.on('close', () => process.exit(0))
process.stdin.resume()
