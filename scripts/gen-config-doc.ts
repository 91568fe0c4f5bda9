// Rewrites the settings table of docs/configuration.md from the settings' schema.
import { readFileSync, writeFileSync } from 'node:fs';
import {
  EPP_TABLE_END,
  EPP_TABLE_START,
  eppSettingsTable,
  settingsTable,
  TABLE_END,
  TABLE_START,
} from '../src/cli/config/doc-table.js';

const file = new URL('../docs/configuration.md', import.meta.url);
let doc = readFileSync(file, 'utf8');
for (const [startMarker, endMarker, table] of [
  [TABLE_START, TABLE_END, settingsTable()],
  [EPP_TABLE_START, EPP_TABLE_END, eppSettingsTable()],
]) {
  const start = doc.indexOf(startMarker);
  const end = doc.indexOf(endMarker);
  if (start < 0 || end < 0) throw new Error(`docs/configuration.md has no markers ${startMarker}`);
  doc = doc.slice(0, start) + table + doc.slice(end + endMarker.length);
}
writeFileSync(file, doc);
