// Rewrites the settings table of docs/configuration.md from the settings' schema.
import { readFileSync, writeFileSync } from 'node:fs';
import { settingsTable, TABLE_END, TABLE_START } from '../src/cli/config/doc-table.js';

const file = new URL('../docs/configuration.md', import.meta.url);
const doc = readFileSync(file, 'utf8');
const start = doc.indexOf(TABLE_START);
const end = doc.indexOf(TABLE_END);
if (start < 0 || end < 0) throw new Error('docs/configuration.md has no settings table markers');
writeFileSync(file, doc.slice(0, start) + settingsTable() + doc.slice(end + TABLE_END.length));
